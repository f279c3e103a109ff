"""The fault drills of the demo that the job controller heals, with nobody re-running a job.

- ``--kill-node-after S``: S seconds after the job's first epoch the last worker's machine
  dies (its processes and its job share, SIGKILL). The job controller sees the attempt fail,
  marks the instance Unhealthy (SetInstanceHealth), Auto Scaling replaces it (the emulated
  Auto Scaling of ``emulator.autoscaling``: the drain hook, the replacement's boot and its
  notifications), the replacement joins, and the controller restarts the job from its
  checkpoint at the full world size, under the same job id and the same ``dl-run``.
  With ``--elastic`` the job (``dl-run --elastic``) does not wait for it: torchrun carries
  on with the survivors at once, the controller sees the node's executor heartbeat lost and
  marks it Unhealthy itself (its ``node_losses`` record), and the replacement, gated and
  admitted, joins the running attempt; the demo prints "training again on N survivors
  after X s; replacement joined after Y s" (:func:`survivors_line`).
- ``--kill-master-after S``: the master's machine dies instead (its agent, executor, job
  controller, job share, and the ``dl-run`` following the job there). Nobody is left to
  report it: EC2's status check marks the instance Unhealthy, Auto Scaling replaces it, the
  new master takes the cluster over from EFS (``bootstrap_scripts.agent.formation``), its
  job controller restarts the job (a ``master-lost`` restart), and the demo re-attaches on
  the new master with ``dl-jobs logs ID -f`` as a user would.
- ``--unhealthy-node``: one worker boots with a failing GPU driver (``emulator.gpus``); the
  controller's health gate fails it before the first attempt, marks it Unhealthy, and the
  job starts once Auto Scaling's replacement joined.

What happened is read from the product's own records: the controller's (``dl-jobs show ID
--json``: each restart with its kind, node, time of detection and seconds to resume) and
the emulated Auto Scaling's events; the demo fails saying what did not happen.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import time
from pathlib import Path

from rich.markup import escape

from bootstrap_scripts.node.procgroup import signal_group
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.managed_records import ControllerHeartbeat
from emulator import deploy as dp
from emulator.demo import joblog, scenarios
from emulator.demo.cluster import node_membership
from emulator.demo.context import BIN_DIR, DemoContext, DemoError
from emulator.demo.joblog import JobRun
from emulator.nodes import Node, base_env

#: How long the demo waits for a replaced master to take the cluster over.
TAKEOVER_TIMEOUT_S = 180.0
#: While the demo follows a job, a job controller heartbeat this old means nobody runs the
#: job any more: the demo stops following and says so (instead of waiting forever).
CONTROLLER_STALE_S = 60.0


def wanted(ns: argparse.Namespace) -> bool:
    return (ns.kill_node_after is not None or ns.kill_master_after is not None
            or ns.unhealthy_node)


def attempt_shares(ctx: DemoContext, job: JobRun, address: str) -> list[int]:
    """The process groups of the running attempt's share on the node at ``address``."""
    attempt = joblog.attempt_job_id(ctx.cluster_paths, job)
    return joblog.share_groups_of(ctx.efs, attempt, address) if attempt else []


def gate_failure(record: dict, address: str) -> str:
    """The check the health gate failed ``address`` on, from the job controller's record
    (``gate_failures``: "<address> (<instance>): <check>: <detail>"); DemoError without."""
    for entry in record.get("gate_failures") or ():
        if entry.startswith(f"{address} "):
            return entry.split("): ", 1)[-1]
    raise DemoError(f"the job controller recorded no health-gate failure of {address}: "
                    f"{list(record.get('gate_failures') or ())}")


def note_start(kill: dict | None, world_size: int, full_size: int, now: float) -> str:
    """``--elastic --kill-node-after``: after the kill, the first (re)start of the workers
    below the full size is the job training again on the survivors, and the next one at the
    full size is the replacement joining; both noted in ``kill`` (seconds after it). What to
    say, "" when nothing new."""
    if kill is None or now <= kill["t"]:
        return ""
    if "survivors" not in kill and world_size < full_size:
        kill["survivors"], kill["survivors_s"] = world_size, round(now - kill["t"], 2)
        return (f"training again on {world_size} survivors, {kill['survivors_s']:.1f} s after "
                f"the {kill['what']} was killed: the replacement is not there yet")
    if "survivors" in kill and "joined_s" not in kill and world_size >= full_size:
        kill["joined_s"] = round(now - kill["t"], 2)
        return (f"the replacement joined: training at world size {world_size}, "
                f"{kill['joined_s']:.1f} s after the kill")
    return ""


def survivors_line(kill: dict) -> str:
    """The elastic drill's outcome in one line; DemoError when a part did not happen."""
    if "survivors" not in kill:
        raise DemoError("the elastic job never trained on the survivors after the worker was "
                        "killed")
    if "joined_s" not in kill:
        raise DemoError(f"the replacement never joined the elastic job (it trained on "
                        f"{kill['survivors']} survivors from {kill['survivors_s']:.1f} s after "
                        f"the kill): use more --epochs")
    return (f"training again on {kill['survivors']} survivors after "
            f"{kill['survivors_s']:.1f} s; replacement joined after {kill['joined_s']:.1f} s")


class Recovery:
    """The drills asked for (see the module docstring), as a demo scenario."""

    def __init__(self, ctx: DemoContext) -> None:
        self.ctx = ctx
        self.ns = ctx.ns
        self.full_size = len(ctx.membership.nodes) if ctx.membership else 0
        self.kill: dict | None = None
        self.master_kill: dict | None = None
        ctx.recovery.setdefault("unhealthy", None)
        #: ``--elastic --kill-node-after`` with the job sized by the demo: the job ends
        #: ``EPOCHS_AFTER_SCENARIO`` epochs after the replacement joined (``--stop-file``)
        self.stop_file: Path | None = None
        self.epochs_after_join = 0

    def train_args(self) -> list[str]:
        """The example's ``--stop-file`` when the demo sized the elastic job (its epochs are
        an upper bound holding the kill and the replacement's way in; it ends once the
        replacement trained a little)."""
        if not getattr(self.ns, "epochs_sized", False) or self.ns.kill_node_after is None:
            return []
        self.stop_file = self.ctx.efs / "demo" / "scenario-done"
        self.stop_file.parent.mkdir(parents=True, exist_ok=True)
        self.stop_file.unlink(missing_ok=True)
        return ["--stop-file", str(self.stop_file)]

    # -- while the job runs --------------------------------------------------------------------
    def on_line(self, line: str, job: JobRun) -> None:
        if self.ns.elastic and (start := joblog.worker_start(line)) is not None:
            self.ctx.elastic["starts"].append({"world_size": start.world_size,
                                               "step": start.step,
                                               "at_s": round(time.monotonic() - self.ctx.t0, 2)})
            said = note_start(self.kill, start.world_size, self.full_size, time.monotonic())
            if said:
                self.ctx.ok(said)
        rec = joblog.epoch(line)
        if rec is not None and self.stop_file is not None and self.kill and \
                "joined_s" in self.kill and rec["world_size"] >= self.full_size:
            self.epochs_after_join += 1
            if self.epochs_after_join == scenarios.EPOCHS_AFTER_SCENARIO:
                self.stop_file.write_text("the demo's drill is done\n")
                self.ctx.ok(f"the replacement trained: the job ends after this epoch "
                            f"(--stop-file {self.stop_file})")
        if rec is None or not job.restart_lines:
            return
        now = time.monotonic()
        for drill in (self.kill, self.master_kill):
            if drill and "training_again_s" not in drill and now > drill["t"] and \
                    rec["world_size"] == self.full_size and \
                    len(job.restart_lines) >= drill.get("restarts_before", 0) + 1:
                drill["training_again_s"] = round(now - drill["t"], 2)
                self.ctx.ok(f"training again at world size {rec['world_size']} (epoch "
                            f"{rec['epoch']}), {drill['training_again_s']:.1f} s after the "
                            f"{drill['what']} was killed")

    def on_tick(self, job: JobRun, first_epoch_at: float) -> None:
        self.watch_controller(job)
        since = time.monotonic() - first_epoch_at
        if self.ns.kill_node_after is not None and self.kill is None and \
                since >= self.ns.kill_node_after:
            workers = [n for n in self.ctx.live_nodes() if n.role == "worker"]
            self.kill = self.lose(workers[-1], job, "worker")
            self.ctx.kill_info = self.kill
            job.killed = self.kill
        if self.ns.kill_master_after is not None and self.master_kill is None and \
                since >= self.ns.kill_master_after:
            master = self.ctx.master()
            if master is not None:
                self.master_kill = self.lose(master, job, "master")
                self.ctx.recovery["kill_master"] = self.master_kill
                job.killed = self.master_kill

    def watch_controller(self, job: JobRun) -> None:
        """DemoError when the job's controller stopped heartbeating (a master's death is
        allowed for: its replacement's controller gets the time to take over)."""
        now = time.monotonic()
        if self.master_kill is not None and now - self.master_kill["t"] < TAKEOVER_TIMEOUT_S:
            return
        hb = store.read_record_or_none(self.ctx.cluster_paths.controller_heartbeat,
                                       ControllerHeartbeat)
        age = time.time() - hb.heartbeat if hb is not None else 0.0
        if hb is not None and age > CONTROLLER_STALE_S:
            raise DemoError(f"the job controller stopped heartbeating {age:.0f} s ago "
                            f"({hb.instance_id}, pid {hb.pid}, state {hb.state}) while job "
                            f"{job.managed_id} runs: see its log dl-controller.log in "
                            f"{self.ctx.logs}")

    def lose(self, node: Node, job: JobRun, what: str) -> dict:
        """The machine dies: its processes and its job share, SIGKILL; a master takes the
        ``dl-run`` that followed the job on it along."""
        ctx = self.ctx
        shares = attempt_shares(ctx, job, node.address)
        followers = list(ctx.runners) if what == "master" else []
        node.kill(shares)
        for runner in followers:
            signal_group(runner.pid, signal.SIGKILL)
        ctx.save_state()
        t = time.monotonic()
        ctx.console.print(f"    [bold red]killed the {what} {node.instance_id} "
                          f"({node.address})[/]: every process of the machine and its job "
                          f"share (process groups {[node.group.pid if node.group else 0, *shares]})"
                          + (", and the dl-run following the job there" if followers else ""))
        return {"what": what, "instance_id": node.instance_id, "address": node.address,
                "at_s": round(t - ctx.t0, 2), "t": t, "wall": time.time(),
                "share_pgids": shares, "restarts_before": len(job.restart_lines)}

    # -- after the follower exited -------------------------------------------------------------
    def finish(self, job: JobRun) -> JobRun:
        """Re-attach after a lost master, then check what the drills asked for happened;
        returns the job run whose outcome is the job's."""
        ctx = self.ctx
        if self.ns.kill_master_after is not None:
            if self.master_kill is None:
                raise DemoError(f"the job ended before the master was killed "
                                f"({self.ns.kill_master_after:g} s after its first epoch): use "
                                "a smaller --kill-master-after or more --epochs")
            ctx.ok(f"dl-run on the master died with it (exit status {job.exit_code}); job "
                   f"{job.managed_id} is the job controller's, on EFS")
            self.wait_takeover()
            job = ctx.attach_job(job.managed_id, scenario=self)
        if not job.managed_id:
            raise DemoError("dl-run printed no managed job id: is the job controller installed?")
        job.record = self.show(job.managed_id)
        if job.exit_code == 0:
            self.check(job)
        return job

    def wait_takeover(self) -> None:
        """Until a new master runs and applied a generation naming itself master."""
        ctx, kill = self.ctx, self.master_kill
        ctx.step("recovery: EC2's status check fails the lost master, Auto Scaling replaces it, "
                 "the new master takes the cluster over")

        def taken_over() -> Node | None:
            for n in ctx.live_nodes():
                m = node_membership(n) if n.role == "master" else None
                if n.instance_id != kill["instance_id"] and m is not None and \
                        m.master.instance_id == n.instance_id:
                    return n
            return None

        try:
            new = ctx.autoscaling.run_until(taken_over, TAKEOVER_TIMEOUT_S,
                                            "a replacement master taking the cluster over")
        except TimeoutError as exc:
            raise DemoError(f"{exc} (after killing {kill['instance_id']}); see the logs in "
                            f"{ctx.logs}") from None
        m = node_membership(new)
        kill.update(replaced_by=new.instance_id, new_address=new.address,
                    generation=m.generation, took_over_s=round(time.monotonic() - kill["t"], 2))
        ctx.adopt_membership(m)
        ctx.ok(f"{new.instance_id} ({new.address}) took the cluster over: generation "
               f"{m.generation}, {kill['took_over_s']:.1f} s after the kill")

    def check_elastic(self, job: JobRun, drill: dict, record: dict) -> None:
        """``--elastic``: the job trained on the survivors before the replacement joined;
        the controller recorded the node's loss itself and Auto Scaling replaced it."""
        ctx, iid = self.ctx, drill["instance_id"]
        line = survivors_line(drill)
        loss = next((x for x in record.get("node_losses") or ()
                     if x.get("instance_id") == iid or x.get("address") == drill["address"]),
                    None)
        # EC2's status check (8 s here) may fail the machine first: Auto Scaling then
        # terminates it through the drain hook, a departure the controller does not record
        drill["node_loss"] = loss
        if loss is not None:
            drill["detected_s"] = round(loss["at"] - drill["wall"], 2)
        drill["replaced"] = bool(ctx.autoscaling and ctx.autoscaling.events_of(
            "unhealthy-terminated", iid))
        if not drill["replaced"]:
            raise DemoError(f"Auto Scaling never replaced the lost worker {iid}")
        drill["summary"] = line
        ctx.ok(line + (f" (the controller saw {drill['address']} lost "
                       f"{drill['detected_s']:.1f} s after the kill"
                       + (" and marked it Unhealthy)" if loss.get("marked_unhealthy") else ")")
                       if loss is not None else " (EC2's status check failed the machine and "
                       "Auto Scaling replaced it)"))

    def show(self, job_id: str) -> dict:
        """``dl-jobs show ID --json`` on the live master: the controller's record."""
        master = self.ctx.master()
        if master is None:
            raise DemoError(f"no live master to ask about job {job_id}")
        res = subprocess.run([str(master.root / BIN_DIR / "dl-jobs"), "--root",
                              str(master.root), "show", job_id, "--json"],
                             cwd=dp.REPO_ROOT, env=base_env(self.ctx.aws), capture_output=True,
                             text=True, timeout=60)
        if res.returncode != 0:
            raise DemoError(f"dl-jobs show {job_id} --json exited {res.returncode}: "
                            f"{(res.stderr or res.stdout).strip()}")
        return json.loads(res.stdout)

    def check(self, job: JobRun) -> None:
        """Each drill asked for happened, as the controller and Auto Scaling recorded it."""
        ctx, record = self.ctx, job.record or {}
        restarts = list(record.get("restart_log") or [])
        cloud = ctx.autoscaling
        for drill, kind in ((self.kill, "worker"), (self.master_kill, "master")):
            if drill is None:
                if kind == "worker" and self.ns.kill_node_after is not None:
                    raise DemoError(f"the job ended before the worker was killed "
                                    f"({self.ns.kill_node_after:g} s after its first epoch): "
                                    "use a smaller --kill-node-after or more --epochs")
                continue
            iid = drill["instance_id"]
            if kind == "worker" and self.ns.elastic:
                self.check_elastic(job, drill, record)
                continue
            rec = next((r for r in restarts if (kind == "worker" and (
                r.get("instance_id") == iid or r.get("address") == drill["address"]))
                or (kind == "master" and r.get("kind") == "master-lost")), None)
            if rec is None:
                raise DemoError(f"job {job.managed_id} succeeded but the controller recorded "
                                f"no restart for the lost {kind} {iid}: {restarts}")
            drill["restart"] = rec
            drill["detected_s"] = round(rec["at"] - drill["wall"], 2)
            if rec.get("seconds_to_resume") is not None:
                drill["resumed_s"] = round(rec["at"] + rec["seconds_to_resume"]
                                           - drill["wall"], 2)
            drill["replaced"] = bool(cloud and cloud.events_of("unhealthy-terminated", iid))
            drill["status_check_failed"] = bool(cloud and cloud.events_of(
                "status-check-failed", iid))
            if not drill["replaced"]:
                raise DemoError(f"Auto Scaling never replaced the lost {kind} {iid}")
            ctx.ok(f"restart of job {job.managed_id} after the lost {kind}: "
                   f"{rec.get('kind')}, detected {drill['detected_s']:.1f} s after the kill, "
                   f"resumed on {rec.get('next_world_size')} node(s)"
                   + (f" from epoch {rec['resumed_epoch']}" if rec.get("resumed_epoch")
                      is not None else ""))
        sick = ctx.recovery.get("unhealthy")
        if sick is not None:
            marked = cloud.events_of("unhealthy-terminated", sick["instance_id"]) if cloud \
                else []
            if not marked:
                raise DemoError(f"the worker with the failing GPU driver {sick['address']} "
                                "was never replaced (the health gate should have failed it)")
            sick["replaced_s"] = round(marked[0].at - ctx.t0, 2)
            first = job.epochs[0]["seen"] if job.epochs else None
            if first is not None and first < sick["replaced_s"]:
                raise DemoError(f"the job trained before {sick['address']} (failing GPU "
                                "driver) was replaced: the health gate let it through")
            sick["gate_failure"] = gate_failure(record, sick["address"])
            why = escape(sick["gate_failure"])
            ctx.ok(f"{sick['address']} failed the health gate ({why}) and was replaced "
                   f"({sick['replaced_s']:.1f} s into the demo)")
        if job.world_size != self.full_size:
            raise DemoError(f"job {job.managed_id} ended at world size {job.world_size}, not "
                            f"the full {self.full_size}: a replacement did not join")
