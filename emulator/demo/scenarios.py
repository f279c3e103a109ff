"""What the demo plays besides a plain training run, and when, as AWS would play it.

- failed launches (``--fail-launches K``): before the nodes boot, K worker instances never
  come up (the group's desired capacity stays, fewer launched);
- a lost node (``--kill-node-after S``): S seconds after the job's first epoch a worker dies
  with its job share; then the group terminates it, the Lambda hears of it, the survivors
  apply the new membership and the job resumes from its checkpoint;
- scaling a running elastic job (``--add-worker-after`` / ``--remove-worker-after``): a
  worker is added as ``dl-scale`` would add it, then removed through the drain lifecycle
  hook.

A scenario that acts during the job has ``on_line`` (every line the job prints) and
``on_tick`` (about every 0.2 s once the first epoch was printed).
"""

from __future__ import annotations

import argparse
import subprocess
import time
import uuid
from typing import Protocol

from rich.markup import escape

from bootstrap_scripts.procgroup import stop_groups
from bootstrap_scripts.protocol import state, store
from bootstrap_scripts.protocol.records import DrainRecord
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
#: The termination lifecycle hook the drain goes through.
DRAIN_HOOK = "drain"


class Scenario(Protocol):
    def on_line(self, line: str, job: JobRun) -> None: ...

    def on_tick(self, job: JobRun, first_epoch_at: float) -> None: ...


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
        c = ctx.cluster
        ctx.step("recovery: the group terminates the lost instance; its notification reaches "
                 "the Lambda")
        asg = ctx.session().client("autoscaling")
        asg.terminate_instance_in_auto_scaling_group(InstanceId=kill["instance_id"],
                                                     ShouldDecrementDesiredCapacity=True)
        rec = ctx.invoker.deliver(c.topic_arn, nt.notification(
            nt.TERMINATE, c.worker.name, instance_id=kill["instance_id"]))
        ctx.info(f"EC2_INSTANCE_TERMINATE {kill['instance_id']} -> {', '.join(rec['outcomes'])}")
        survivors = masters_first(ctx.live_nodes())
        doc = wait_membership(ctx, survivors, after_generation=ctx.membership.generation)
        ctx.adopt_membership(doc)
        kill["new_generation"] = doc.generation
        kill["membership_s"] = round(time.monotonic() - t, 2)
        ctx.ok(f"generation {doc.generation} without {kill['address']} on all "
               f"{len(survivors)} survivor(s) in {kill['membership_s']:.1f} s")


class ElasticScenario:
    """``--elastic``: follow the job's world sizes; add a worker, later drain it."""

    def __init__(self, ctx: DemoContext) -> None:
        self.ctx = ctx
        self.el = ctx.elastic

    def on_line(self, line: str, job: JobRun) -> None:
        ctx, el = self.ctx, self.el
        now = time.monotonic()
        if start := joblog.worker_start(line):
            el["starts"].append({"world_size": start.world_size, "step": start.step,
                                 "at_s": round(now - ctx.t0, 2)})
            drain = el.get("drain")
            if drain and "continued_s" not in drain and start.world_size < drain["world_before"]:
                drain["continued_s"] = round(now - drain["t"], 2)
                ctx.ok(f"training continues at world size {start.world_size} without "
                       f"{drain['address']}, {drain['continued_s']:.1f} s after the "
                       f"lifecycle notice")
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
        now = time.monotonic()
        if ns.add_worker_after is not None and "join" not in el and \
                now - first_epoch_at >= ns.add_worker_after:
            self.scale_out()
        join = el.get("join")
        if ns.remove_worker_after is not None and join and "drain" not in el and \
                "first_step_t" in join and now - join["first_step_t"] >= ns.remove_worker_after:
            self.scale_in(join)

    def scale_out(self) -> None:
        ctx = self.ctx
        c = ctx.cluster
        want = len(c.worker.instances) + 1
        ctx.step(f"scale-out: worker group desired capacity -> {want} (dl-scale --workers "
                 f"{want})")
        master = ctx.master()
        how = "dl-scale"
        res = subprocess.run([PYTHON, "-m", "bootstrap_scripts.ops.scale", "--root",
                              str(master.root), "--mount-point", str(ctx.efs), "--workers",
                              str(want)], cwd=dp.REPO_ROOT, env=base_env(ctx.aws),
                             capture_output=True, text=True, timeout=60)
        if res.returncode != 0:
            how = "set_desired_capacity"
            why = (res.stderr or res.stdout).strip()[-300:]
            ctx.info(f"dl-scale exited {res.returncode}: {escape(why)}; setting the desired "
                     "capacity with boto3")
            ctx.session().client("autoscaling").set_desired_capacity(
                AutoScalingGroupName=c.worker.name, DesiredCapacity=want)
        known = {n.instance_id for n in ctx.nodes}
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
        rec = ctx.invoker.deliver(c.topic_arn, nt.notification(
            nt.LAUNCH, c.worker.name, instance_id=inst.instance_id, desired=want))
        ctx.info(f"{inst.instance_id} {inst.address} booted (agent pid {node.agent_pid}); "
                 f"EC2_INSTANCE_LAUNCH -> {outcome(rec)}")
        self.el["join"] = {"instance_id": inst.instance_id, "address": inst.address,
                           "agent_started": t, "how": how, "at_s": round(t - ctx.t0, 2)}

    def ensure_drain_hook(self, asg) -> None:
        """moto does not create lifecycle hooks from CloudFormation: create the stack's."""
        name = self.ctx.cluster.worker.name
        hooks = asg.describe_lifecycle_hooks(AutoScalingGroupName=name)
        if not any(h["LifecycleHookName"] == DRAIN_HOOK for h in hooks["LifecycleHooks"]):
            asg.put_lifecycle_hook(
                LifecycleHookName=DRAIN_HOOK, AutoScalingGroupName=name,
                LifecycleTransition=nt.TERMINATING, HeartbeatTimeout=300,
                DefaultResult="CONTINUE")

    def scale_in(self, join: dict) -> None:
        ctx = self.ctx
        c = ctx.cluster
        paths = ctx.cluster_paths
        iid, addr = join["instance_id"], join["address"]
        ctx.step(f"scale-in: {iid} ({addr}) leaves through the drain lifecycle hook")
        asg = ctx.session().client("autoscaling")
        self.ensure_drain_hook(asg)
        world_before = max((s["world_size"] for s in self.el["starts"]), default=0)
        t = time.monotonic()
        token = str(uuid.uuid4())
        rec = ctx.invoker.deliver(c.topic_arn, nt.lifecycle_notification(
            c.worker.name, iid, hook=DRAIN_HOOK, token=token))
        ctx.info(f"EC2_INSTANCE_TERMINATING {iid} -> {outcome(rec)}")
        drain = {"instance_id": iid, "address": addr, "t": t, "world_before": world_before,
                 "at_s": round(t - ctx.t0, 2), "requested_by": "master agent"}
        self.el["drain"] = drain
        req = paths.drain_request(iid)
        if not wait_for(req, 10):
            # the master agent did not turn the lifecycle notice into a drain: play its part
            drain["requested_by"] = "harness (no drain request from the master agent)"
            ctx.info("[yellow]no drain request from the master agent within 10 s: the "
                     "harness writes it (protocol §7 step 2)[/]")
            now = time.time()
            state.write_drain(ctx.efs, DrainRecord(
                instance_id=iid, address=addr, requested_at=now, deadline=now + 240,
                asg=c.worker.name, role="worker", lifecycle_hook=DRAIN_HOOK,
                lifecycle_action_token=token, member=True,
                reason="written by the demo harness"))
        done = paths.drain_done(iid)
        finished = wait_for(done, 90)
        drain["done_s"] = round(time.monotonic() - t, 2) if finished else None
        ctx.ok(f"{done.name} written {drain['done_s']} s after the notice"
               if finished else f"[yellow]no {done.name} within 90 s[/]")
        # moto has no complete_lifecycle_action: after the drain, terminate as AWS would
        asg.terminate_instance_in_auto_scaling_group(InstanceId=iid,
                                                     ShouldDecrementDesiredCapacity=True)
        node = next(n for n in ctx.nodes if n.instance_id == iid)
        stop_groups([node.group], grace=10)
        node.status = "removed"
        rec = ctx.invoker.deliver(c.topic_arn, nt.notification(nt.TERMINATE, c.worker.name,
                                                               instance_id=iid))
        ctx.info(f"EC2_INSTANCE_TERMINATE {iid} -> {outcome(rec)}")
        dp.refresh_instances(ctx.session(), c.groups.values())


def wait_for(path, seconds: float) -> bool:
    """Poll until ``path`` can be opened, at most ``seconds``; whether it appeared."""
    deadline = time.monotonic() + seconds
    while not store.exists(path) and time.monotonic() < deadline:
        time.sleep(0.1)
    return store.exists(path)
