"""What the demo plays besides a plain training run, and when, as AWS would play it.

- failed launches (``--fail-launches K``): before the nodes boot, K worker instances never
  come up (the group's desired capacity stays, fewer launched);
- lost and unhealthy nodes (``--kill-node-after``, ``--kill-master-after``,
  ``--unhealthy-node``): the job controller heals the job; see ``emulator.demo.recovery``;
- scaling a running elastic job (``--add-worker-after`` / ``--remove-worker-after``):
  ``dl-scale --workers`` adds a worker, ``dl-scale --remove`` removes it; the rest is AWS
  (the emulator's moto: the lifecycle hook, the notifications, the termination once the
  master completes the action) and the product. Both must happen while the job trains,
  or the demo fails saying what did not; without ``--epochs`` the job is sized for them.

A scenario that acts during the job has ``on_line`` (every line the job prints) and
``on_tick`` (about every 0.2 s once the first epoch was printed).
"""

from __future__ import annotations

import argparse
import math
import subprocess
import time
from pathlib import Path
from typing import Protocol

from rich.markup import escape

from bootstrap_scripts.protocol import state, store
from bootstrap_scripts.protocol.records import DrainDone
from emulator import deploy as dp
from emulator.autoscaling import AutoScaling
from emulator.demo import joblog
from emulator.demo.context import DemoContext, DemoError, http_json
from emulator.demo.joblog import JobRun
from emulator.nodes import PYTHON, Node, base_env

#: The default data-preparation hook with --fail-data-prep: fails on a node whose address
#: the harness marked (the agent gives the hook DL_NODE_ADDRESS and EFS_MOUNT).
PREP_COMMAND = 'test ! -e "$EFS_MOUNT/emulator/prep-fail-$DL_NODE_ADDRESS"'
#: Epochs when neither --epochs nor a scenario's timing asks for more.
DEFAULT_EPOCHS = 20
#: The example job's pause after each step when a scenario runs (``--step-delay``).
STEP_DELAY = 0.03
#: Training samples of the example (scikit-learn's 1,797 digits, 20 % held out) and its
#: global batch in the elastic demo: ceil(1437 / 64) = 23 steps per epoch.
TRAIN_SAMPLES = 1437
ELASTIC_BATCH = 64
#: Time allowed for an added node to boot, prepare and take its first step, and for a
#: removed one to drain until training continues without it (the job is sized with them).
JOIN_BUDGET_S = 30.0
DRAIN_BUDGET_S = 30.0
TAIL_S = 5.0
#: ``--elastic --kill-node-after``: from the kill until the lost worker's replacement trains
#: (the liveness rule's 10 s, EC2's status check, Auto Scaling's replacement, its boot, the
#: health gate, admission, the workers' restart at the full size: 47 s measured here).
REPLACEMENT_BUDGET_S = 60.0
#: Epoch lines after the scenario's last action before the demo ends a job it sized
#: (``--stop-file``): the job trains a little at its final world size.
EPOCHS_AFTER_SCENARIO = 2
#: After training continued without the removed node: how long Auto Scaling may take to
#: terminate it (the master completes the action once the node's shares stopped).
TERMINATION_WAIT_S = 60.0
#: Workers a kept cluster may add above its base ones (its ``maxWorkers``, unless
#: ``--context`` sets it): ``dlc scale --workers N`` has room both ways on it.
KEPT_ROOM = 2
#: The example's held-out accuracy target (``--require-acc``'s default): it reaches 0.96 to
#: 0.975 in 20 epochs and about 0.958 in 8. A shorter run's default is the lower target,
#: said before the demo starts (3 epochs reach about 0.92, 1 epoch about 0.86).
TARGET_ACC = 0.95
SHORT_RUN_ACC = 0.80
SHORT_RUN_EPOCHS = 10


class Scenario(Protocol):
    def on_line(self, line: str, job: JobRun) -> None: ...

    def on_tick(self, job: JobRun, first_epoch_at: float) -> None: ...


def min_epoch_seconds() -> float:
    """A lower bound of one epoch's time with a scenario (every step sleeps STEP_DELAY)."""
    return math.ceil(TRAIN_SAMPLES / ELASTIC_BATCH) * STEP_DELAY


def elastic_seconds(ns: argparse.Namespace, *, budgets: bool) -> float:
    """Training time the elastic scenario needs after the first epoch: its timings, plus
    (``budgets``) the time joining and draining take (``--kill-node-after``: the kill, then
    the replacement's way into the job)."""
    if getattr(ns, "kill_node_after", None) is not None:
        return ns.kill_node_after + (REPLACEMENT_BUDGET_S + TAIL_S if budgets else 0.0)
    if ns.add_worker_after is None:
        return 0.0
    need = ns.add_worker_after + (JOIN_BUDGET_S + TAIL_S if budgets else 0.0)
    if ns.remove_worker_after is not None and not ns.fail_data_prep:
        need += ns.remove_worker_after + (DRAIN_BUDGET_S if budgets else 0.0)
    return need


def job_epochs(ns: argparse.Namespace) -> tuple[int, str]:
    """(epochs, "") for the job, or (0, why) when the given --epochs cannot hold the
    scenario: even at the fastest pace (each step's delay alone) the job must still train
    when the scenario's last action is due."""
    if not ns.elastic:
        return (DEFAULT_EPOCHS if ns.epochs is None else ns.epochs), ""
    pace = min_epoch_seconds()
    if ns.epochs is None:
        return max(DEFAULT_EPOCHS, math.ceil(elastic_seconds(ns, budgets=True) / pace)), ""
    least = elastic_seconds(ns, budgets=False)
    if ns.epochs * pace < least:
        return 0, (f"--epochs {ns.epochs} can end after {ns.epochs * pace:.1f} s of training "
                   f"({ns.epochs} x {math.ceil(TRAIN_SAMPLES / ELASTIC_BATCH)} steps x "
                   f"{STEP_DELAY} s step delay), but the scenario acts up to {least:g} s "
                   f"after the first epoch (--add-worker-after + --remove-worker-after): "
                   f"omit --epochs to let the demo size the job, or give --epochs "
                   f"{math.ceil(elastic_seconds(ns, budgets=True) / pace)} or more")
    return ns.epochs, ""


def require_acc(ns: argparse.Namespace) -> tuple[float, str]:
    """(the accuracy the job must reach, a line to say before starting or ""): the given
    ``--require-acc``, else the example's target, lowered for a run too short to reach it."""
    if ns.require_acc is not None:
        return ns.require_acc, ""
    if ns.epochs >= SHORT_RUN_EPOCHS:
        return TARGET_ACC, ""
    return SHORT_RUN_ACC, (f"--epochs {ns.epochs}: the job must reach {SHORT_RUN_ACC:.2f} "
                           f"held-out accuracy ({TARGET_ACC:.2f} takes {SHORT_RUN_EPOCHS} "
                           f"epochs or more; --require-acc sets it)")


def deploy_context(ns: argparse.Namespace) -> dict[str, str]:
    """The ``-c key=value`` the chosen scenario needs on top of ``workerCount``."""
    context = {}
    if ns.add_worker_after is not None:
        context["maxWorkers"] = str(ns.workers + 1)  # room for the added worker
    if getattr(ns, "keep", False):  # room for README's `dlc scale --workers N` on top
        context["maxWorkers"] = str(ns.workers + KEPT_ROOM)
    if ns.data_prep or ns.fail_data_prep:
        context["dataPrepScript"] = ns.data_prep or PREP_COMMAND
    return context


def fail_launches(ctx: DemoContext) -> None:
    k = ctx.ns.fail_launches
    if not k:
        return
    c = ctx.cluster
    ctx.step(f"failing {k} worker launch(es) as AWS would (insufficient capacity)")
    res = http_json(f"{ctx.control}/fail-launches", "POST",
                    {"group": c.worker.name, "count": k})
    ctx.failed_launches = list(res["instance_ids"])
    dp.refresh_instances(ctx.session(), c.groups.values())
    ctx.ok(f"{', '.join(ctx.failed_launches)} never came up: terminated, not in the "
           f"group; desired stays {c.worker.desired}, {len(c.worker.instances)} launched")


def enforce_iam(ctx: DemoContext) -> None:
    """``--enforce-iam``: moto's IAM authorization on (``emulator.iam_enforcement``) once the
    stack exists, so every node, job and function call from here on is held to its role."""
    if not ctx.ns.enforce_iam:
        return
    ctx.step("turning on IAM enforcement (every call from now on is checked against the "
             "caller's policies; the demo's own calls act as the account's administrator)")
    res = http_json(f"{ctx.control}/iam-enforcement", "POST", {"enabled": True})
    if not res.get("enabled"):
        raise DemoError(f"the emulator did not turn IAM enforcement on: {res}")
    ctx.ok(f"IAM enforced; the administrator is {res['admin_role']}")


class ElasticScenario:
    """``--elastic``: follow the job's world sizes; add a worker with ``dl-scale --workers``,
    later remove it with ``dl-scale --remove``; both must happen while the job trains."""

    def __init__(self, ctx: DemoContext) -> None:
        self.ctx = ctx
        self.el = ctx.elastic
        self.cloud: AutoScaling | None = None
        self.first_epoch_at: float | None = None
        self.training = True  # until the job printed its final line
        self.adding = ""  # the instance dl-scale --workers added (booted by Auto Scaling)
        #: a job the demo sized ends once the scenario is done: this file (``--stop-file``,
        #: set by :meth:`train_args`)
        self.stop_file: Path | None = None
        self.epochs_after_done = 0

    def train_args(self) -> list[str]:
        """The example's extra arguments: ``--stop-file`` when the demo sized the job (it
        is an upper bound then; the job ends once the scenario is done)."""
        if not getattr(self.ctx.ns, "epochs_sized", False):
            return []
        self.stop_file = self.ctx.efs / "demo" / "scenario-done"
        self.stop_file.parent.mkdir(parents=True, exist_ok=True)
        self.stop_file.unlink(missing_ok=True)
        return ["--stop-file", str(self.stop_file)]

    def done(self) -> bool:
        """Everything the user asked for has happened (see :meth:`finish`)."""
        ns, el = self.ctx.ns, self.el
        join, drain = el.get("join"), el.get("drain")
        if ns.add_worker_after is not None and join is None:
            return False
        if ns.fail_data_prep:
            return join is not None and store.exists(
                self.ctx.cluster_paths.prepared(join["instance_id"], "failed"))
        if join is not None and "first_step_s" not in join:
            return False
        return ns.remove_worker_after is None or bool(drain and "continued_s" in drain)

    def on_line(self, line: str, job: JobRun) -> None:
        ctx, el = self.ctx, self.el
        now = time.monotonic()
        if joblog.final_acc(line) is not None:
            self.training = False
        if self.stop_file is not None and joblog.epoch(line) is not None and self.done():
            self.epochs_after_done += 1
            if self.epochs_after_done == EPOCHS_AFTER_SCENARIO:
                self.stop_file.write_text("the demo's scenario is done\n")
                ctx.ok(f"the scenario is done: the job ends after this epoch "
                       f"(--stop-file {self.stop_file})")
        if start := joblog.worker_start(line):
            el["starts"].append({"world_size": start.world_size, "step": start.step,
                                 "at_s": round(now - ctx.t0, 2)})
            drain = el.get("drain")
            if drain and "continued_s" not in drain and start.world_size < drain["world_before"]:
                drain["continued_s"] = round(now - drain["t"], 2)
                ctx.ok(f"training continues at world size {start.world_size} without "
                       f"{drain['address']}, {drain['continued_s']:.1f} s after dl-scale "
                       "--remove")
        elif step := joblog.first_step(line):
            join = el.get("join")
            if join and step.address == join["address"] and "first_step_s" not in join:
                join["first_step_s"] = round(now - join["agent_started"], 2)
                join["first_step_t"] = now
                join["world_size"] = step.world_size
                ctx.ok(f"{join['address']} took its first training step at world size "
                       f"{step.world_size}, {join['first_step_s']:.1f} s after its agent "
                       f"started")

    def on_tick(self, job: JobRun, first_epoch_at: float) -> None:
        ns, el = self.ctx.ns, self.el
        self.first_epoch_at = first_epoch_at
        if self.cloud is None:
            self.cloud = self.ctx.autoscaling
            self.ctx.boot_hooks.append(self.joined)
        if self.cloud is not None:
            self.cloud.tick()
        self.watch_drain()
        if not self.training:
            return  # the job is finishing: nothing is started any more
        now = time.monotonic()
        if ns.add_worker_after is not None and "join" not in el and \
                now - first_epoch_at >= ns.add_worker_after:
            self.scale_out()
        join = el.get("join")
        if ns.remove_worker_after is not None and join and "drain" not in el and \
                "first_step_t" in join and now - join["first_step_t"] >= ns.remove_worker_after:
            self.scale_in(join)

    def dl_scale(self, *args: str) -> str:
        """``dl-scale`` on the master, as a user runs it; its output, or DemoError."""
        ctx = self.ctx
        master = ctx.master()
        res = subprocess.run([PYTHON, "-m", "bootstrap_scripts.ops.scale", "--root",
                              str(master.root), "--mount-point", str(ctx.efs), *args],
                             cwd=dp.REPO_ROOT, env=base_env(ctx.aws), capture_output=True,
                             text=True, timeout=60)
        out = (res.stdout + res.stderr).strip()
        if res.returncode != 0:
            raise DemoError(f"dl-scale {' '.join(args)} exited {res.returncode}: {out}")
        ctx.info(escape(out))
        return out

    def scale_out(self) -> None:
        ctx = self.ctx
        c = ctx.cluster
        want = len(c.worker.instances) + 1
        ctx.step(f"scale-out: dl-scale --workers {want} on the master")
        known = {n.instance_id for n in ctx.nodes}
        self.dl_scale("--workers", str(want))
        dp.refresh_instances(ctx.session(), c.groups.values())
        new = [i for i in c.worker.instances if i.instance_id not in known]
        if not new:
            raise DemoError(f"the worker group launched no instance for desired {want}")
        inst = new[0]
        if ctx.ns.fail_data_prep:
            marker = ctx.efs / "emulator" / f"prep-fail-{inst.address}"
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text("the harness makes this node's data preparation fail\n")
        self.adding = inst.instance_id
        if self.cloud is not None:
            self.cloud.tick(force=True)  # the group's new instance boots from its template

    def joined(self, node: Node, t: float) -> None:
        """The emulated Auto Scaling booted a node (its boot began at ``t``): the one
        dl-scale added."""
        if node.instance_id != self.adding or "join" in self.el:
            return
        self.ctx.info(f"{node.instance_id} {node.address} booted (agent pid {node.agent_pid})")
        self.el["join"] = {"instance_id": node.instance_id, "address": node.address,
                           "agent_started": t, "how": "dl-scale --workers",
                           "at_s": round(t - self.ctx.t0, 2)}

    def scale_in(self, join: dict) -> None:
        ctx = self.ctx
        iid, addr = join["instance_id"], join["address"]
        ctx.step(f"scale-in: dl-scale --remove {addr} ({iid}) on the master")
        world_before = max((s["world_size"] for s in self.el["starts"]), default=0)
        t, wall = time.monotonic(), time.time()
        self.dl_scale("--remove", addr)
        self.el["drain"] = {"instance_id": iid, "address": addr, "t": t, "wall": wall,
                            "world_before": world_before, "at_s": round(t - ctx.t0, 2),
                            "how": "dl-scale --remove"}

    def watch_drain(self) -> None:
        """Each step of the drain as it happens (all of it done by AWS and the product), timed
        from ``dl-scale --remove`` with the times the product's own records carry."""
        drain = self.el.get("drain")
        if not drain:
            return
        ctx, iid, start = self.ctx, drain["instance_id"], drain["wall"]
        record = state.read_drain(ctx.efs, iid)
        if record is not None and "requested_s" not in drain:
            drain["requested_s"] = round(record.requested_at - start, 2)
            ctx.ok(f"the master agent started the drain of {iid} {drain['requested_s']:.1f} s "
                   "after dl-scale --remove (lifecycle notification -> Lambda -> drain-request)")
        done = store.read_record_or_none(ctx.cluster_paths.drain_done(iid), DrainDone)
        if done is not None and "done_s" not in drain:
            drain["done_s"] = round(done.done_at - start, 2)
            ctx.ok(f"{iid}'s executor stopped its shares ({drain['done_s']:.1f} s)")
        if record is not None and record.completed and "completed_s" not in drain:
            drain.update(completed_s=round(record.completed_at - start, 2),
                         reason=record.reason, outcome=record.outcome)
            ctx.ok(f"the master completed the lifecycle action ({record.reason}: "
                   f"{escape(record.outcome)}, {drain['completed_s']:.1f} s)")
        stopped = self.cloud.events_of("node-stopped", iid) if self.cloud else []
        if stopped and "terminated_s" not in drain:
            drain["terminated_s"] = round(stopped[0].at - drain["t"], 2)

    def finish(self, job: JobRun) -> None:
        """The scenario the user asked for must have happened while the job trained; the
        removed instance must then be terminated by Auto Scaling. DemoError says what
        did not happen."""
        ns, el, ctx = self.ctx.ns, self.el, self.ctx
        if job.exit_code != 0:
            return  # the job's own failure is what the demo reports
        ran = (time.monotonic() - self.first_epoch_at) if self.first_epoch_at else 0.0
        ended = (f"the job trained for {ran:.0f} s after its first epoch ({ns.epochs} "
                 f"epochs), and ended")
        advice = ("give more --epochs (or none: the demo then sizes the job for the "
                  "scenario) or shorter timings")
        join, drain = el.get("join"), el.get("drain")
        if ns.add_worker_after is not None and join is None:
            raise DemoError(f"{ended} before the scale-out due {ns.add_worker_after:g} s "
                            f"after the first epoch: {advice}")
        if ns.fail_data_prep:
            if not store.exists(ctx.cluster_paths.prepared(join["instance_id"], "failed")):
                raise DemoError(f"{ended} before the data preparation of "
                                f"{join['address']} failed: {advice}")
            return
        if join is not None and "first_step_s" not in join:
            raise DemoError(f"{ended} before the added worker {join['address']} took a "
                            f"training step: {advice}")
        if ns.remove_worker_after is None:
            return
        if drain is None:
            raise DemoError(f"{ended} before the removal due {ns.remove_worker_after:g} s "
                            f"after {join['address']} joined: {advice}")
        if "continued_s" not in drain:
            raise DemoError(f"{ended} before training continued without "
                            f"{drain['address']}: {advice}")
        deadline = time.monotonic() + TERMINATION_WAIT_S
        while "terminated_s" not in drain and time.monotonic() < deadline:
            if self.cloud:
                self.cloud.tick()
            self.watch_drain()
            time.sleep(0.2)
        if "terminated_s" not in drain:
            raise DemoError(f"Auto Scaling did not terminate {drain['instance_id']} within "
                            f"{TERMINATION_WAIT_S:.0f} s after training continued without it "
                            f"(drain record: {state.read_drain(ctx.efs, drain['instance_id'])})")
        ctx.ok(f"{drain['instance_id']} terminated by Auto Scaling "
               f"{drain['terminated_s']:.1f} s after dl-scale --remove")
