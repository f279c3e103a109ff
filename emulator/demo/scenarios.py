"""What the demo plays besides a plain training run, and when, as AWS would play it.

- failed launches (``--fail-launches K``): before the nodes boot, K worker instances never
  come up (the group's desired capacity stays, fewer launched);
- a lost node (``--kill-node-after S``): S seconds after the job's first epoch a worker dies
  with its job share; then the group takes it out of service (as its health check would),
  its termination hook's notification reaches the Lambda, the master drains it, the
  survivors apply the new membership and the job resumes from its checkpoint;
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
from typing import Protocol

from rich.markup import escape

from bootstrap_scripts.procgroup import stop_groups
from bootstrap_scripts.protocol import state, store
from bootstrap_scripts.protocol.records import DrainDone
from emulator import deploy as dp
from emulator import notifications as nt
from emulator.demo import joblog
from emulator.demo.cluster import boot_node, masters_first, outcome, wait_membership
from emulator.demo.context import DemoContext, DemoError, http_json
from emulator.demo.joblog import JobRun
from emulator.nodes import PYTHON, base_env

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
#: After training continued without the removed node: how long Auto Scaling may take to
#: terminate it (the master completes the action once the node's shares stopped).
TERMINATION_WAIT_S = 60.0


class Scenario(Protocol):
    def on_line(self, line: str, job: JobRun) -> None: ...

    def on_tick(self, job: JobRun, first_epoch_at: float) -> None: ...


def min_epoch_seconds() -> float:
    """A lower bound of one epoch's time with a scenario (every step sleeps STEP_DELAY)."""
    return math.ceil(TRAIN_SAMPLES / ELASTIC_BATCH) * STEP_DELAY


def elastic_seconds(ns: argparse.Namespace, *, budgets: bool) -> float:
    """Training time the elastic scenario needs after the first epoch: its timings, plus
    (``budgets``) the time joining and draining take."""
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
        return (ns.epochs or DEFAULT_EPOCHS), ""
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


def deploy_context(ns: argparse.Namespace) -> dict[str, str]:
    """The ``-c key=value`` the chosen scenario needs on top of ``workerCount``."""
    context = {}
    if ns.add_worker_after is not None:
        context["maxWorkers"] = str(ns.workers + 1)  # room for the added worker
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


class KillScenario:
    """``--kill-node-after``: lose the last worker mid-training, then recover."""

    def __init__(self, ctx: DemoContext, after: float) -> None:
        self.ctx = ctx
        self.after = after

    def on_line(self, line: str, job: JobRun) -> None:
        pass

    def on_tick(self, job: JobRun, first_epoch_at: float) -> None:
        if job.killed is None and time.monotonic() - first_epoch_at >= self.after:
            job.killed = self.kill_worker(job.job_id)

    def kill_worker(self, job_id: str) -> dict:
        ctx = self.ctx
        victim = [n for n in ctx.live_nodes() if n.role == "worker"][-1]
        shares = joblog.share_groups_of(ctx.efs, job_id, victim.address)
        victim.kill(shares)
        ctx.save_state()
        at = time.monotonic() - ctx.t0
        ctx.console.print(f"    [bold red]killed worker {victim.instance_id} "
                          f"({victim.address})[/]: agent, executor, IMDS and its job share "
                          f"(process groups {[victim.group.pid, *shares]})")
        ctx.kill_info = {"instance_id": victim.instance_id, "address": victim.address,
                         "at_s": round(at, 2), "share_pgids": shares}
        return ctx.kill_info

    def recover(self, job: JobRun) -> None:
        """The job must have failed over the kill; the group and the Lambda then remove the
        lost node and every survivor applies the membership without it."""
        ctx = self.ctx
        kill = job.killed
        if kill is None:
            raise DemoError(f"the job ended before the kill ({self.after} s after "
                            f"training started): use a smaller --kill-node-after or more "
                            f"--epochs")
        if job.exit_code == 0:
            raise DemoError(f"the job succeeded although worker {kill['address']} was killed")
        if job.epochs and job.epochs[-1]["epoch"] >= ctx.ns.epochs:
            raise DemoError(f"training finished all {ctx.ns.epochs} epochs before worker "
                            f"{kill['address']} was killed: use a smaller --kill-node-after "
                            f"or more --epochs")
        named = job.names_node(kill["address"])
        kill["job_error"] = job.failure
        kill["job_error_names_node"] = named
        ctx.ok(f"the job failed with exit status {job.exit_code}"
               + (f", naming the killed node {kill['address']}" if named else ""))
        t = time.monotonic()
        ctx.step("recovery: the group takes the lost instance out of service; its drain "
                 "hook's notification reaches the Lambda")
        # As the group's health check would (without a replacement: the demo goes on with
        # the survivors); the instance then waits in its termination hook.
        asg = ctx.session().client("autoscaling")
        asg.terminate_instance_in_auto_scaling_group(InstanceId=kill["instance_id"],
                                                     ShouldDecrementDesiredCapacity=True)
        cloud = CloudFollower(ctx)
        cloud.follow()
        survivors = masters_first(ctx.live_nodes())
        doc = wait_membership(ctx, survivors, after_generation=ctx.membership.generation)
        ctx.adopt_membership(doc)
        kill["new_generation"] = doc.generation
        kill["membership_s"] = round(time.monotonic() - t, 2)
        ctx.ok(f"generation {doc.generation} without {kill['address']} on all "
               f"{len(survivors)} survivor(s) in {kill['membership_s']:.1f} s")


class CloudFollower:
    """What the demo does for AWS while a scenario runs: the topic's Lambda subscription
    (every notification Auto Scaling published, delivered to the handler) and EC2 stopping
    the node of an instance it terminated."""

    def __init__(self, ctx: DemoContext) -> None:
        self.ctx = ctx
        c = ctx.cluster
        self.topic = nt.TopicSubscription(ctx.control, c.topic_arn, ctx.invoker)
        self.notices: list[dict] = []
        self.terminated: dict[str, float] = {}  # instance id -> monotonic time seen
        self.next_check = 0.0

    def follow(self) -> None:
        ctx = self.ctx
        for rec in self.topic.pump():
            event = rec["events"][0].split(":")[-1] if rec["events"] else "?"
            iid = rec["instances"][0] if rec["instances"] else ""
            self.notices.append({"event": event, "instance_id": iid,
                                 "outcomes": rec["outcomes"],
                                 "at_s": round(time.monotonic() - ctx.t0, 2)})
            if event != "TEST_NOTIFICATION":
                ctx.info(f"{event} {iid} -> {outcome(rec)}")
        now = time.monotonic()
        if now < self.next_check:
            return
        self.next_check = now + 1.0
        running = {n.instance_id: n for n in ctx.live_nodes()}
        if not running:
            return
        ec2 = ctx.session().client("ec2")
        for res in ec2.describe_instances(InstanceIds=list(running))["Reservations"]:
            for inst in res["Instances"]:
                if inst["State"]["Name"] != "terminated":
                    continue
                node = running[inst["InstanceId"]]
                stop_groups([node.group], grace=10)  # EC2 shuts the instance down
                node.status = "removed"
                self.terminated[node.instance_id] = time.monotonic()
                ctx.save_state()
                ctx.ok(f"EC2 terminated {node.instance_id} ({node.address}): its node is "
                       "stopped")
        dp.refresh_instances(ctx.session(), ctx.cluster.groups.values())


class ElasticScenario:
    """``--elastic``: follow the job's world sizes; add a worker with ``dl-scale --workers``,
    later remove it with ``dl-scale --remove``; both must happen while the job trains."""

    def __init__(self, ctx: DemoContext) -> None:
        self.ctx = ctx
        self.el = ctx.elastic
        self.cloud: CloudFollower | None = None
        self.first_epoch_at: float | None = None
        self.training = True  # until the job printed its final line

    def on_line(self, line: str, job: JobRun) -> None:
        ctx, el = self.ctx, self.el
        now = time.monotonic()
        if joblog.final_acc(line) is not None:
            self.training = False
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
            self.cloud = CloudFollower(self.ctx)
        self.cloud.follow()
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
        t = time.monotonic()
        node = boot_node(ctx, inst, "worker", c.worker.install_args)
        ctx.info(f"{inst.instance_id} {inst.address} booted (agent pid {node.agent_pid})")
        self.el["join"] = {"instance_id": inst.instance_id, "address": inst.address,
                           "agent_started": t, "how": "dl-scale --workers",
                           "at_s": round(t - ctx.t0, 2)}

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
        if self.cloud and iid in self.cloud.terminated and "terminated_s" not in drain:
            drain["terminated_s"] = round(self.cloud.terminated[iid] - drain["t"], 2)

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
                self.cloud.follow()
            self.watch_drain()
            time.sleep(0.2)
        if "terminated_s" not in drain:
            raise DemoError(f"Auto Scaling did not terminate {drain['instance_id']} within "
                            f"{TERMINATION_WAIT_S:.0f} s after training continued without it "
                            f"(drain record: {state.read_drain(ctx.efs, drain['instance_id'])})")
        ctx.ok(f"{drain['instance_id']} terminated by Auto Scaling "
               f"{drain['terminated_s']:.1f} s after dl-scale --remove")
