"""Goodput under a fault schedule: an elastic managed job (survivors now, the replacement
joins) and an elastic job with a spare node (a spare takes the lost node's place at once,
the replacement waits as the next spare: docs/elastic-training.md, "Spare nodes") against
today's wait-for-the-replacement policy, the same schedule for all three.

Real processes on the emulator's loopback nodes (``tests.support.cluster``): 6 nodes, the job
on 4 (master and three workers), two spares whose executors run but which are not members
yet (the replacements); the spare run has one node more, a member the job does not train
on (``--nnodes 1:4`` on 5), and its victims are chosen among the nodes whose ranks train
(``participants``). The job: the example (``train_digits``, torchrun, CPU/gloo, its own
flags) run through ``jobs/digits_hooks.py``, which adds the hang drill's hook and a straggler
hook without changing it; ``EPOCHS`` x 23 steps, managed by the master's job controller (Auto
Scaling calls against moto's server). The schedule, each fault injected at a fixed step of
rank 0, once the job trains again after the previous one (so both policies meet the same
faults at the same work):

1. a worker's machine lost (``Node.kill``: its executor and its share, SIGKILL);
2. another worker's machine lost;
3. a rank hangs (sleeps forever after declaring a step; ``--hang-timeout``);
4. a straggler: one rank sleeps ``STRAGGLE_S`` more per step for ``STRAGGLE_STEPS`` steps;
   its row says whether the controller named it (the job record's ``stragglers``: the
   example reports each rank's own compute time, which the all-reduce does not equalise)
   and when (the sampler's first sight of it after the injection).

Each lost worker's replacement enters the membership ``BOOT_DELAY`` s after the loss: a
realistic 240 s (terminate, launch, boot a GPU AMI, agent, data preparation, gate) scaled by
``SCALE`` = 1/12, as the master agent publishes a node that booted and registered. The
master is not killed: in this executor-only cluster a lost master takes the rendezvous
store, the controller and every attempt with it, and surviving it needs a new master taking
the cluster over from EFS (agent formation, Auto Scaling replacing the master), which only
the full demo emulates (``make demo ARGS="--kill-master-after 1"``, docs/demo.md); under
either policy it is the same ``master-lost`` restart.

Every figure comes from the product's records (``goodput.py``: progress files, the job's
record, hang reports); the harness's clock gives only the injection times and the
replacements' registrations. Printed, never asserted beyond the job succeeding (``make
bench``): per run, the wall time cut into rows that add up to it (``goodput_breakdown.py``:
launch, steps kept, steps redone, each idle stretch by cause with its events, end); after
both, a COMPUTED PROJECTION (labelled so, beside the measured ETTR, never instead of it) of
the measured per-fault costs with the unscaled boot, since ``SCALE`` shortens the boot but
not torch's restarts, which favours the waiting policy. With ``make torchft-setup`` done, one
trial of the torchft bench's harness (``torchft_trials.py``: real processes) measures
recovery in place after both runs, and a second COMPUTED PROJECTION puts it in place of each
worker loss's measured idle stretches (``goodput_breakdown.in_place_schedule``,
``in_place_fault_cost``).
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path

import pytest

from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.managed_records import HangReport, ManagedJob
from bootstrap_scripts.protocol.paths import SHARE_STARTED_SUFFIX, ClusterPaths, NodePaths
from bootstrap_scripts.protocol.records import RankProgress, ShareStarted
from emulator.resources import create_cluster
from tests.chaos import goodput
from tests.chaos import goodput_breakdown as bd
from tests.chaos import torchft_figures as tf
from tests.chaos import torchft_trials as ftb
from tests.chaos.drills import wait_for
from tests.conftest import REGION
from tests.support.cluster import free_rdzv_port

JOB = str(Path(__file__).parent / "jobs" / "digits_hooks.py")
#: the replacement's boot: 240 s on AWS, scaled by SCALE for this run. ``GOODPUT_SCALE=1``
#: runs it unscaled (with ``GOODPUT_EPOCHS`` for a job long enough to carry it: the waiting
#: run then takes about 20 min, docs/testing.md ("Figures")).
REALISTIC_BOOT = 240.0
SCALE = float(os.environ.get("GOODPUT_SCALE") or 1 / 12)
BOOT_DELAY = REALISTIC_BOOT * SCALE
HANG_TIMEOUT = 10.0
#: x 23 steps (1,437 training samples, global batch 64); ``GOODPUT_EPOCHS`` for more work
EPOCHS = int(os.environ.get("GOODPUT_EPOCHS") or 20)
#: rank 0's step at (or after) which each fault is injected, the same for every policy: at
#: the same fractions of the work whatever ``EPOCHS`` (40, 120, 200, 280 of 460 steps)
KILL_1, KILL_2, HANG_AT, STRAGGLE_AT = (round(EPOCHS * 23 * k / 460) for k in (40, 120, 200,
                                                                            280))
#: the example's pause per step, standing in for a GPU step's compute
STEP_DELAY = 0.25
STRAGGLE_STEPS, STRAGGLE_S = 40, 0.3
FULL = 4
#: the rank the hang and the straggler hooks act on
RANK = 1
SAMPLE_S = 0.25
#: the projection's job: WORK_H hours of fault-free work, one fault every MTBF_H hours of it
WORK_H, MTBF_H = 24.0, (0.25, 1.0, 4.0, 24.0)
#: waiting for the replacement (today's), elastic (survivors now), elastic with one spare;
#: ``GOODPUT_POLICIES=waiting,spare`` runs some of them
POLICIES = tuple((os.environ.get("GOODPUT_POLICIES") or "waiting,elastic,spare").split(","))
#: each policy's figures and wall-time breakdown, for the projection after the runs
RUNS: dict[str, tuple[goodput.RunFigures, bd.Breakdown]] = {}


class Sampler(threading.Thread):
    """Reads the job's records every ``SAMPLE_S``: the current attempt's progress files
    (every distinct record kept) and the job record."""

    def __init__(self, efs: Path, job_id: str) -> None:
        super().__init__(daemon=True)
        self.paths = ClusterPaths(efs)
        self.job_id = job_id
        self.seen: dict[tuple, goodput.Sample] = {}
        self.job: ManagedJob | None = None
        self.stragglers: set[str] = set()
        #: "rank <r>" -> when the job's record first named it a straggler (this clock)
        self.named_at: dict[str, float] = {}
        self.first_said = ""  # the record's first straggler line
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.look()
            time.sleep(SAMPLE_S)

    def look(self) -> None:
        job = store.read_record_or_none(self.paths.managed(self.job_id).record, ManagedJob)
        if job is None or not job.attempt:
            return
        self.job = job
        self.stragglers.update(job.stragglers)
        for line in job.stragglers:
            self.named_at.setdefault(line.split(" on ")[0], time.time())
            self.first_said = self.first_said or line
        pdir = self.paths.job(f"{self.job_id}.{job.attempt}").progress_dir
        for path in sorted(pdir.glob("*.json")) if pdir.is_dir() else ():
            rec = store.read_record_or_none(path, RankProgress)
            if rec is not None:
                s = goodput.Sample(job.attempt, rec.rank, rec.pid, rec.started_at, rec.step,
                                   rec.time, tuple(rec.recent_step_seconds))
                self.seen[(s.attempt, s.rank, s.pid, s.step)] = s

    def rank0_step(self) -> int:
        mine = [s for s in self.seen.values() if s.rank == 0 and self.job
                and s.attempt == self.job.attempt]
        return max((s.step for s in mine), default=0)

    def training_since(self, since: float) -> bool:
        """A generation of ranks started after ``since``."""
        return any(g.started_at > since for g in goodput.generations(self.seen.values()))


def share_groups(efs: Path, attempt_id: str, address: str) -> list[int]:
    nodes = ClusterPaths(efs).job(attempt_id).nodes
    return [rec.pgid for _s, rec in store.scan_records(nodes, ShareStarted,
                                                       suffix=SHARE_STARTED_SUFFIX)
            if rec.address == address]


def node_of(pid: int) -> str:
    """The emulated node a rank's process runs on: its parent is the node's torchrun agent,
    whose command line names the node's address (``--local-addr``)."""
    with open(f"/proc/{pid}/stat") as fh:
        ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
    with open(f"/proc/{ppid}/cmdline", "rb") as fh:
        argv = fh.read().decode().split("\0")
    return next(a.split("=", 1)[1] for a in argv if a.startswith("--local-addr="))


def participants(sampler: Sampler) -> set[str]:
    """The nodes whose ranks train now: each rank's newest process in the current attempt
    (a spare node runs an agent but no rank)."""
    job = sampler.job
    newest: dict[int, goodput.Sample] = {}
    for s in sampler.seen.values():
        if job is not None and s.attempt == job.attempt and (
                s.rank not in newest or s.started_at > newest[s.rank].started_at):
            newest[s.rank] = s
    out = set()
    for s in newest.values():
        try:
            out.add(node_of(s.pid))
        except (OSError, StopIteration, ValueError):
            continue  # that process has ended
    return out


def goodput_run(emu, moto: str, tmp: Path, *, policy: str) -> goodput.RunFigures:
    elastic, spares = policy != "waiting", int(policy == "spare")
    res = create_cluster(moto, cluster_id=f"goodput-{policy}", workers=5 + spares)
    c = emu(6 + spares, instances=res.node_instances("master") + res.node_instances("worker"))
    master, w1, w2, w3, *extra = c.addresses
    *standby, spare1, spare2 = extra
    members = [master, w1, w2, w3, *standby]
    c.publish(1, members)
    for spare in (spare1, spare2):
        NodePaths(c.roots[spare]).membership.unlink()  # booting: not members yet
    c.start_executors()
    c.start_controller({"AWS_ENDPOINT_URL": moto, "AWS_ACCESS_KEY_ID": "testing",
                        "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": REGION,
                        "AWS_DEFAULT_REGION": REGION})
    hooks = tmp / f"hooks-{policy}"
    hooks.mkdir()
    hang, straggle = hooks / "hang", hooks / "straggle"
    res_run = c.run("--detach", "--json", *(("--elastic",) if elastic else ()),
                    *(("--nnodes", f"1:{FULL}") if spares else ()),
                    "--rdzv-port", free_rdzv_port(c), "--fail-grace", "1", "--min-nodes", "2",
                    "--replace-timeout", "600", "--max-restarts", "6", "--hang-timeout",
                    f"{HANG_TIMEOUT:g}", "--env", f"GOODPUT_RANK={RANK}", "--env",
                    f"GOODPUT_HANG={hang}", "--env", f"GOODPUT_STRAGGLE={straggle}", "--env",
                    f"GOODPUT_STRAGGLE_S={STRAGGLE_S}", "--", "python", JOB, "--epochs",
                    str(EPOCHS), "--checkpoint-every", "4", "--step-delay", str(STEP_DELAY),
                    "--require-acc", "0.9", managed=True, timeout=120)
    assert res_run.returncode == 0, res_run.stdout
    job_id = json.loads(res_run.stdout.strip().splitlines()[-1])["job_id"]
    sampler = Sampler(c.efs, job_id)
    sampler.start()
    injected: list[tuple[str, float]] = []
    registered: list[float] = []  # when each replacement entered the membership
    generation, pending = 1, []  # (due, members) of a replacement's registration
    schedule = [("worker killed", KILL_1, w3, spare1), ("worker killed", KILL_2, w2, spare2),
                ("rank hung", HANG_AT, "", ""), ("straggler", STRAGGLE_AT, "", "")]
    straggle_until = None
    try:
        deadline = time.monotonic() + 1200 + EPOCHS * 23 * STEP_DELAY * 3 + 4 * BOOT_DELAY
        while time.monotonic() < deadline:
            job = sampler.job
            if job is not None and job.state in ("succeeded", "failed", "cancelled"):
                break
            now = time.time()
            for due, new in [p for p in pending if p[0] <= now]:
                generation += 1
                c.publish(generation, new, "a worker lost; its replacement registered")
                registered.append(time.time())
                pending.remove((due, new))
            step = sampler.rank0_step()
            if straggle_until is not None and step >= straggle_until:
                straggle.unlink(missing_ok=True)
                straggle_until = None
            # each fault once training resumed after the previous one (and its replacement
            # registered): at a fixed step, whatever the policy
            ready = not injected or sampler.training_since(injected[-1][1])
            if schedule and ready and step >= schedule[0][1] and not pending:
                what, _at, victim, spare = schedule.pop(0)
                if victim and spares:  # a node that trains, not the one that waits
                    victim = sorted(participants(sampler) - {master})[-1]
                if victim:
                    attempt_id = f"{job_id}.{job.attempt}"
                    c.node(victim).kill(share_groups(c.efs, attempt_id, victim))
                    members = [m for m in members if m != victim] + [spare]
                    pending.append((time.time() + BOOT_DELAY, list(members)))
                elif what == "rank hung":
                    hang.write_text("")
                else:
                    straggle.write_text("")
                    straggle_until = step + STRAGGLE_STEPS
                injected.append((what, time.time()))
            time.sleep(0.1)
        sampler.done.set()
        sampler.join(timeout=5)
        sampler.look()
        rec = wait_for("the job's end", lambda: (r := store.read_record_or_none(
            ClusterPaths(c.efs).managed(job_id).record, ManagedJob)) and r.finished_at and r,
            timeout=60)
        assert rec.state == "succeeded", f"{rec.state}: {rec.message}\n" \
            f"{c.controller_log()[-3000:]}"
        faults = []
        for k, (what, at) in enumerate(injected):
            detected, note = None, ""
            until = injected[k + 1][1] if k + 1 < len(injected) else float("inf")
            if what == "worker killed":
                # the controller's first record of it, before the next fault
                losses = [x.at for x in rec.node_losses if at <= x.at < until]
                restarts = [(x.at, x.kind) for x in rec.restart_log if at <= x.at < until]
                detected = min([*losses, *(t for t, _k in restarts[:1])], default=None)
                note = ("node loss recorded" if losses and detected == min(losses) else
                        f"restart record: {restarts[0][1]}" if restarts else
                        "nothing recorded")
            elif what == "rank hung":
                reports = [store.read_record_or_none(ClusterPaths(c.efs).managed(job_id)
                                                     .attempt_hang(n), HangReport)
                           for n in range(1, rec.attempt + 1)]
                rep = next((r for r in reports if r is not None and r.detected_at >= at), None)
                if rep is not None:
                    detected = rep.detected_at
                    note = f"named rank(s) {list(rep.odd_ranks)}"
            else:
                first = [t for r, t in sampler.named_at.items() if r == f"rank {RANK}"
                         and t >= at]
                detected = min(first, default=None)
                named = sorted({s.split(":")[0] for s in sampler.stragglers})
                note = (f"named: {', '.join(named)}; first said: {sampler.first_said}"
                        if named else "not named")
            faults.append((what, at, detected, note))
        figures = goodput.run_figures(policy, sampler.seen.values(), faults, full_size=FULL,
                                      job_span=(rec.started_at, rec.finished_at))
        logs = [line for n in range(1, rec.attempt + 1)
                for path in sorted(ClusterPaths(c.efs).job(f"{job_id}.{n}").nodes.glob("*.log"))
                for line in path.read_text(errors="replace").splitlines()]
        b = bd.breakdown(goodput.generations(sampler.seen.values()),
                         [(w, at, d) for w, at, d, _n in faults],
                         productive_s=figures.productive_s,
                         job_span=(rec.started_at, rec.finished_at), registrations=registered,
                         attempts=[(u.attempt, u.started_at) for u in rec.usage])
        stall, saves, found = bd.checkpoint_stall(logs)
        figures.detail = ["  where the wall time went (every second of the job record's span):",
                          *bd.lines(b),
                          f"    of the steps kept: {stall:.2f} s inside checkpoint saves "
                          f"({saves} async saves, from {found} summary line(s) of rank 0), "
                          f"{figures.productive_s - figures.steps * figures.reference_s:+.1f} s "
                          f"against {figures.steps} x the fault-free "
                          f"{figures.reference_s:.3f} s/step (the straggler's slow steps, "
                          f"the faster steps of fewer processes on 2 cores)"]
        RUNS[policy] = (figures, b)
        return figures
    finally:
        sampler.done.set()
        c.stop()  # before the next cluster: two clusters never load this machine together


@pytest.mark.bench
def test_bench_goodput_elastic_vs_waiting_for_the_replacement(emu, moto_reset, tmp_path):
    runs = [goodput_run(emu, moto_reset, tmp_path, policy=p) for p in POLICIES]
    print(f"\ngoodput: {EPOCHS * 23} steps of train_digits on {FULL} nodes (real processes: "
          f"executors, job controller, torchrun, CPU/gloo; this 2-core machine); two workers "
          f"lost, a rank hung (--hang-timeout {HANG_TIMEOUT:g}), a straggler; each replacement "
          f"registers {BOOT_DELAY:.0f} s after the loss ({REALISTIC_BOOT:.0f} s x "
          f"{SCALE:.4g}); the spare run has a fifth node waiting (--nnodes 1:{FULL})")
    print(goodput.report(runs, full_size=FULL))
    print(projection_text(measure_in_place(tmp_path)))
    print("master lost: not in this schedule (an executor-only cluster has no agent to take "
          "the cluster over from EFS); the full demo plays it: make chaos, drill (j), "
          "make demo ARGS=\"--kill-master-after 1\" (a master-lost restart under either "
          "policy)")
    assert re.search(r"ETTR", goodput.LEGEND)


def fault_costs(figures: goodput.RunFigures, b: bd.Breakdown) -> list[float]:
    """Each worker loss's and the hang's cost with the real boot (``bd.projected_fault_cost``)
    from this run's breakdown; the straggler has none of its own (its slow steps are in the
    steps kept, and it ends when its cause does)."""
    kinds = [f.what for f in figures.faults]
    waited, shrunk = {}, {}
    for k in range(len(kinds)):
        mine = [g for g in b.gaps if g.fault == k]
        own = next((g for g in mine if g.cause != bd.JOINED), None)
        join = next((g for g in mine if g.cause == bd.JOINED), None)
        waited[k] = own is not None and own.waited
        if own is not None and join is not None:
            shrunk[k] = join.start - own.end
    costs = bd.projected_fault_cost(
        b, kinds, shrunk_s=shrunk, full_size=FULL, shrunk_size=FULL - 1,
        boot_scaled=BOOT_DELAY, boot_real=REALISTIC_BOOT, waited=waited,
        step_s=figures.reference_s,
        lost_steps={k: f.lost_steps or 0 for k, f in enumerate(figures.faults)})
    return [c for c, what in zip(costs, kinds, strict=True) if what != "straggler"]


def measure_in_place(tmp: Path) -> tf.Recovery | None:
    """One trial of the torchft bench's harness (``torchft_trials.py``: real processes,
    torchft's Lighthouse as shipped) after the goodput runs, for the in-place projection;
    None (said so) without ``make torchft-setup``."""
    py = ftb.torchft_python()
    if not py:
        print("in-place projection: torchft not installed: make torchft-setup")
        return None
    data = tmp / "digits.pt"
    ftb.write_data(data)
    r, _o = ftb.torchft_trial(py, tmp, data, "in-place", ftb.HEARTBEAT_TIMEOUTS_MS[0])
    return r if r.again_s is not None and r.rejoined_s is not None else None


def projection_text(in_place: tf.Recovery | None = None) -> str:
    """The computed projection, labelled as such, beside (never instead of) the measured
    ETTR; with ``in_place`` (torchft's measured recovery), what the same schedule and the
    realistic rates would give if a worker loss were recovered in place."""
    out = [f"COMPUTED PROJECTION (not measured): the measured cost of each worker loss and of "
           f"the hang, with the replacement's boot put back to {REALISTIC_BOOT:.0f} s (this "
           f"run scaled it by {SCALE:.4g} to {BOOT_DELAY:.0f} s while torch's restarts on 2 "
           f"cores were not scaled) and an elastic job's time on {FULL - 1} of {FULL} nodes "
           f"charged at the missing node's share, spread over {WORK_H:g} h of fault-free work "
           f"at one fault (this schedule's mix) every MTBF hours, plus the measured launch "
           f"and end:"]
    per_policy = {}
    for policy, (figures, b) in RUNS.items():
        costs = per_policy[policy] = fault_costs(figures, b)
        launch_end = b.rows[0][1] + next(s for n, s in b.rows if n.startswith("end:"))
        proj = bd.projection(costs, launch_end_s=launch_end, work_h=WORK_H, mtbfs_h=MTBF_H)
        out.append(f"  {policy}: per-fault cost {', '.join(f'{c:.0f}' for c in costs)} s "
                   f"-> ETTR " + ", ".join(f"{p.ettr:.3f} at MTBF {p.mtbf_h:g} h" for p in proj)
                   + f" (measured under this schedule: {figures.ettr:.3f})")
    for policy in [p for p in per_policy if p != "waiting" and "waiting" in per_policy]:
        for_ettr, for_ratio, there = bd.goal_rates(per_policy["waiting"], per_policy[policy])
        out.append(
            f"  the goals against the fault rate (same projection, a long job): {policy} ETTR "
            ">= 0.9 needs one fault every >= "
            + (f"{for_ettr / 60:.1f} min of work" if for_ettr else "- (never)")
            + f"; {policy} >= 1.5x waiting needs one every <= "
            + (f"{for_ratio / 60:.1f} min, where {policy}'s ETTR is {there:.3f}"
               if for_ratio else "- (never: the cost ratio is below 1.5)")
            + ("; both at once: possible" if for_ettr and for_ratio and for_ratio >= for_ettr
               else "; both at once: not possible with these costs"))
    if in_place is not None and "elastic" in RUNS and "waiting" in per_policy:
        out += in_place_text(in_place, per_policy)
    return "\n".join(out)


def in_place_text(r: tf.Recovery, per_policy: dict[str, list[float]]) -> list[str]:
    """The in-place lines (COMPUTED from torchft's measured recovery and this run's costs)."""
    figures, b = RUNS["elastic"]
    kinds = [f.what for f in figures.faults]
    join = r.join_step_s or 0.0
    wall, ettr = bd.in_place_schedule(
        b, kinds, productive_s=figures.productive_s, step_s=figures.reference_s,
        lost_steps={k: f.lost_steps or 0 for k, f in enumerate(figures.faults)},
        again_s=r.again_s, join_s=join)
    waiting = RUNS["waiting"][0].ettr
    out = [f"COMPUTED PROJECTION (not measured), recovery in place: torchft's measured "
           f"recovery (real processes, this machine, just now: survivors training again "
           f"{r.again_s:.1f} s after a SIGKILL, their longest step while the replacement "
           f"joined {1000 * join:.0f} ms, the replacement back at full size {r.rejoined_s:.1f} "
           f"s after its start) put in place of each worker loss's measured idle stretches "
           f"in the elastic run: this schedule's wall {wall:.1f} s -> ETTR {ettr:.3f} "
           f"(measured elastic {figures.ettr:.3f}, waiting {waiting:.3f}: "
           f"{ettr / waiting if waiting else 0:.2f}x); the hang, launch, end as measured"]
    measured = fault_costs(figures, b)  # the loss and hang costs, in order
    launch_end = b.rows[0][1] + next(s for n, s in b.rows if n.startswith("end:"))
    for spare in (False, True):
        costs = bd.in_place_fault_cost(
            [k for k in kinds if k != "straggler"], measured, again_s=r.again_s, join_s=join,
            rejoin_s=r.rejoined_s, boot_real=REALISTIC_BOOT, full_size=FULL,
            shrunk_size=FULL - 1, spare=spare)
        proj = bd.projection(costs, launch_end_s=launch_end, work_h=WORK_H, mtbfs_h=MTBF_H)
        for_ettr, for_ratio, there = bd.goal_rates(per_policy["waiting"], costs)
        how = ("with a spare group already in the quorum taking the lost one's place"
               if spare else f"on {FULL - 1} of {FULL} nodes until the replacement rejoined")
        out.append(
            f"  in place, boot {REALISTIC_BOOT:.0f} s, {how}: per-fault cost "
            + ", ".join(f"{c:.0f}" for c in costs) + " s -> ETTR "
            + ", ".join(f"{p.ettr:.3f} at MTBF {p.mtbf_h:g} h" for p in proj)
            + "; >= 0.9 needs faults >= "
            + (f"{for_ettr / 60:.1f} min of work apart" if for_ettr else "- (never)")
            + ", >= 1.5x waiting needs them <= "
            + (f"{for_ratio / 60:.1f} min apart (ETTR there {there:.3f})" if for_ratio
               else "- (never)")
            + ("; both at once: possible" if for_ettr and for_ratio and for_ratio >= for_ettr
               else "; both at once: not possible"))
    return out
