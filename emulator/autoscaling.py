"""Auto Scaling and EC2 as they act on their own while a demo or a test runs.

moto answers API calls but never acts by itself: it records an instance's health and does
nothing about it, runs no EC2 status checks, boots no machine from a launch template and
delivers no SNS message to a Lambda. :class:`AutoScaling` plays those parts, one
:meth:`~AutoScaling.tick` at a time (the caller ticks it about every half second), always
through moto's own APIs:

1. **Unhealthy instances are replaced.** An ``InService`` instance whose ``HealthStatus``
   is ``Unhealthy`` (SetInstanceHealth, or a failed status check below) is terminated with
   ``TerminateInstanceInAutoScalingGroup(ShouldDecrementDesiredCapacity=False)``, which is
   what Auto Scaling does with an unhealthy instance: it terminates it and launches a
   replacement to keep the desired capacity
   (https://docs.aws.amazon.com/autoscaling/ec2/userguide/ec2-auto-scaling-health-checks.html,
   https://docs.aws.amazon.com/autoscaling/ec2/userguide/replace-unhealthy-instance.html).
   moto's SetInstanceHealth only stores the status; the termination call goes through the
   emulator's extension of moto (``emulator.lifecycle_hooks``): with a termination lifecycle
   hook the instance first waits in ``Terminating:Wait`` (the master drains it), and the
   group launches the replacement at once, publishing its launch notification.
2. **The machine of a terminated instance stops.** A node whose instance EC2 no longer
   runs (``shutting-down``, ``terminated``) has its processes stopped.
3. **A launched instance boots.** An ``InService`` (or ``Pending``) group instance without a
   node gets one, booted by the caller's ``boot`` function from the group's launch template
   user data (the demo: ``emulator.demo.cluster.boot_node``).
4. **Notifications reach the Lambda.** What Auto Scaling published to the cluster's topic
   (launches, terminations, lifecycle-hook notices) is delivered to the real handler
   (``emulator.notifications.TopicSubscription``), as the topic's Lambda subscription would.
5. **EC2 status checks.** A node whose processes are all dead (the machine is lost) fails
   its instance status check: after ``status_check_seconds`` (default
   :data:`STATUS_CHECK_SECONDS`; EC2 checks every minute and Auto Scaling then acts,
   https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/monitoring-system-instance-status-check.html)
   the instance is marked ``Unhealthy`` (SetInstanceHealth) and step 1 replaces it. That
   is how a lost master is replaced: nobody else is left to report it.
6. **Warm pools** (``emulator.warm_pool`` plays Auto Scaling's side in moto). An instance
   launched into a group's warm pool (``Warmed:Pending:Wait``) boots like any other, its
   metadata serving the target lifecycle state ``Warmed:Stopped``; when moto stops it the
   node's processes stop (its root, installed, stays); when the group draws it from the
   pool (started, ``Pending:Wait``) the node starts again after ``start_delay`` (not the
   boot delay: a start, not a boot), serving ``InService``, with no installer run.
7. **Each machine's systemd.** On a running machine a unit whose process ended is started
   again as its ``Restart=`` / ``RestartSec=`` say (``emulator.nodes.Node.restart_units``),
   e.g. a replacement master's job controller that started before the membership did.
8. **CloudWatch's own round** (``emulator.alarm_evaluator``): once a minute, the groups'
   metrics are published and every alarm is evaluated, its actions run.

Everything it did is kept in :attr:`AutoScaling.events` (with ``time.monotonic()``
stamps), so callers can time failure detection and replacement.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from botocore.exceptions import ClientError

from bootstrap_scripts.node.procgroup import stop_groups
from emulator import notifications as nt
from emulator.alarm_evaluator import CloudWatchActs
from emulator.deploy import Instance
from emulator.nodes import Node

#: How often callers tick the emulated Auto Scaling (seconds).
TICK_SECONDS = 0.5
#: How long a node's processes must all be dead before its instance fails its status check.
STATUS_CHECK_SECONDS = 3.0
#: Lifecycle states in which a group instance is (about to be) a machine that should run.
RUNNING_STATES = ("Pending", "Pending:Wait", "Pending:Proceed", "InService")
#: EC2 instance states of a machine that no longer runs.
GONE_STATES = ("shutting-down", "terminated", "stopping", "stopped")


@dataclass
class Event:
    """One thing the emulated Auto Scaling or EC2 did (``at``: ``time.monotonic()``)."""

    #: status-check-failed | unhealthy-terminated | node-stopped | node-booted |
    #: node-started | unit-restarted
    what: str
    instance_id: str
    role: str
    at: float
    detail: dict = field(default_factory=dict)

    def to_dict(self, t0: float = 0.0) -> dict:
        return {"what": self.what, "instance_id": self.instance_id, "role": self.role,
                "at_s": round(self.at - t0, 2), **self.detail}


class AutoScaling:
    """The emulated Auto Scaling and EC2 of one cluster (see the module docstring).

    ``groups``: role -> Auto Scaling group name. ``nodes()``: every node booted so far (any
    status). ``boot(instance, role)``: boot and return the node of a new instance.
    ``topic``: the cluster's topic subscription (None: no Lambda to deliver to).
    ``say``: one line per action, for the console."""

    def __init__(self, session, groups: dict[str, str], *, nodes: Callable[[], Iterable[Node]],
                 boot: Callable[[Instance, str], Node],
                 topic: nt.TopicSubscription | None = None,
                 say: Callable[[str], None] = lambda _line: None,
                 status_check_seconds: float = STATUS_CHECK_SECONDS,
                 start_delay: float = 0.0) -> None:
        self.asg = session.client("autoscaling")
        self.ec2 = session.client("ec2")
        self.groups = dict(groups)
        self.nodes = nodes
        self.boot = boot
        self.topic = topic
        self.say = say
        self.status_check_seconds = status_check_seconds
        #: seconds a stopped instance takes from StartInstances to its units (step 6)
        self.start_delay = start_delay
        self.events: list[Event] = []
        self.last_tick = float("-inf")
        #: every notification delivered to the Lambda: the invocation records
        self.deliveries: list[dict] = []
        self.dead_since: dict[str, float] = {}  # instance id -> when its processes were all dead
        self.unhealthy_sent: set[str] = set()
        self.terminated: set[str] = set()
        self.stopped: set[str] = set()  # nodes stopped because EC2 terminated their instance
        #: group metrics and alarm evaluation, once a minute (step 8)
        self.cloudwatch = CloudWatchActs(session, say=say)

    # -- one round ---------------------------------------------------------------------------
    def tick(self, *, force: bool = False) -> None:
        """One round of what AWS does by itself (see the module docstring); at most one per
        :data:`TICK_SECONDS` unless ``force`` (callers may tick from faster loops)."""
        now = time.monotonic()
        if not force and now - self.last_tick < TICK_SECONDS:
            return
        self.last_tick = now
        described = self.describe_groups()
        self.status_checks(described, now)
        self.replace_unhealthy(described)
        self.deliver()
        self.stop_gone()
        self.boot_new(self.describe_groups())
        self.boot_warming()
        self.deliver()
        self.systemd(now)
        self.cloudwatch.tick(background=True)

    def events_of(self, what: str, instance_id: str = "") -> list[Event]:
        return [e for e in self.events if e.what == what
                and (not instance_id or e.instance_id == instance_id)]

    # -- the steps ---------------------------------------------------------------------------
    def describe_groups(self) -> dict[str, tuple[str, dict]]:
        """Instance id -> (role, DescribeAutoScalingGroups' instance entry)."""
        out: dict[str, tuple[str, dict]] = {}
        by_name = {name: role for role, name in self.groups.items()}
        res = self.asg.describe_auto_scaling_groups(AutoScalingGroupNames=list(by_name))
        for group in res["AutoScalingGroups"]:
            role = by_name[group["AutoScalingGroupName"]]
            for inst in group.get("Instances", []):
                out[inst["InstanceId"]] = (role, inst)
        return out

    def record(self, what: str, instance_id: str, role: str, line: str, **detail) -> None:
        self.events.append(Event(what, instance_id, role, time.monotonic(), detail))
        self.say(line)

    def status_checks(self, described: dict[str, tuple[str, dict]], now: float) -> None:
        """EC2's instance status check: a machine whose processes are all dead fails it."""
        for node in self.nodes():
            iid = node.instance_id
            if iid not in described or iid in self.unhealthy_sent or not node.procs:
                continue
            role, inst = described[iid]
            if inst["LifecycleState"] != "InService" or node.processes_alive():
                self.dead_since.pop(iid, None)
                continue
            since = self.dead_since.setdefault(iid, now)
            if now - since < self.status_check_seconds:
                continue
            self.asg.set_instance_health(InstanceId=iid, HealthStatus="Unhealthy",
                                         ShouldRespectGracePeriod=False)
            self.unhealthy_sent.add(iid)
            self.record("status-check-failed", iid, role,
                        f"EC2: {iid} ({node.address}) failed its instance status check "
                        f"(every process dead for {now - since:.1f} s): Auto Scaling marks it "
                        "Unhealthy")

    def replace_unhealthy(self, described: dict[str, tuple[str, dict]]) -> None:
        """Auto Scaling terminates an unhealthy in-service instance and replaces it."""
        for iid, (role, inst) in described.items():
            if inst["LifecycleState"] != "InService" or iid in self.terminated:
                continue
            if str(inst.get("HealthStatus", "Healthy")).lower() != "unhealthy":
                continue
            self.asg.terminate_instance_in_auto_scaling_group(
                InstanceId=iid, ShouldDecrementDesiredCapacity=False)
            self.terminated.add(iid)
            self.record("unhealthy-terminated", iid, role,
                        f"Auto Scaling: {iid} ({role}) is Unhealthy: terminating it and "
                        "launching a replacement")

    def deliver(self) -> None:
        """What Auto Scaling published to the topic, to the Lambda."""
        if self.topic is None:
            return
        for rec in self.topic.pump():
            self.deliveries.append({**rec, "at": time.monotonic()})
            event = rec["events"][0].split(":")[-1] if rec["events"] else "?"
            if event != "TEST_NOTIFICATION":
                iid = rec["instances"][0] if rec["instances"] else ""
                self.say(f"{event} {iid} -> {', '.join(rec['outcomes']) or rec['error']}")

    def stop_gone(self) -> None:
        """EC2 shut the machine down: the node of an instance that no longer runs stops."""
        nodes = {n.instance_id: n for n in self.nodes()
                 if n.status in ("running", "killed") and n.instance_id not in self.stopped}
        if not nodes:
            return
        res = self.ec2.describe_instances(InstanceIds=list(nodes))
        for reservation in res["Reservations"]:
            for inst in reservation["Instances"]:
                node = nodes[inst["InstanceId"]]
                if inst["State"]["Name"] not in GONE_STATES:
                    continue
                stop_groups(node.groups, grace=10)
                node.forget_kernel_rules()
                self.stopped.add(node.instance_id)
                state = inst["State"]["Name"]
                node.ec2_state = "stopped" if state in ("stopping", "stopped") else "terminated"
                if node.status == "running":  # a killed node stays "killed" in reports
                    node.status = "stopped" if state in ("stopping", "stopped") else "removed"
                self.record("node-stopped", node.instance_id, node.role,
                            f"EC2 {'stopped' if node.status == 'stopped' else 'terminated'} "
                            f"{node.instance_id} ({node.address}): its machine is stopped",
                            ec2_state=state)

    def boot_new(self, described: dict[str, tuple[str, dict]]) -> None:
        """A group instance that should run but has no machine yet boots from its template;
        one whose machine was stopped in a warm pool starts again."""
        known = {n.instance_id: n for n in self.nodes()}
        for iid, (_role, inst) in described.items():
            node = known.get(iid)
            if node is not None and node.status == "stopped" and iid in self.stopped \
                    and inst["LifecycleState"] in RUNNING_STATES:
                self.start_stopped(node)
        self._boot([(iid, role, "InService") for iid, (role, inst) in described.items()
                    if iid not in known and inst["LifecycleState"] in RUNNING_STATES])

    def boot_warming(self) -> None:
        """An instance launched into a warm pool boots too (step 6): it must be prepared."""
        known = {n.instance_id for n in self.nodes()}
        new = []
        for role, name in self.groups.items():
            try:
                res = self.asg.describe_warm_pool(AutoScalingGroupName=name)
            except ClientError:  # the group is gone (the stack is being deleted)
                continue
            new += [(i["InstanceId"], role, i["LifecycleState"]) for i in res.get("Instances", [])
                    if i["InstanceId"] not in known
                    and i["LifecycleState"].startswith("Warmed:Pending")]
        self._boot(new)

    def start_stopped(self, node: Node) -> None:
        """The group drew ``node``'s stopped instance from its warm pool: EC2 started it."""
        node.set_target_lifecycle_state("InService")
        t = time.monotonic()
        node.start_again(self.start_delay)
        self.stopped.discard(node.instance_id)
        self.record("node-started", node.instance_id, node.role,
                    f"{node.role} {node.instance_id} ({node.address}) drawn from the warm "
                    f"pool: started (agent pid {node.agent_pid}), no user data",
                    start_s=round(time.monotonic() - t, 2), address=node.address)

    def _boot(self, new: list[tuple[str, str, str]]) -> None:
        """Boot ``(instance id, role, lifecycle state)``s that have an address."""
        if not new:
            return
        res = self.ec2.describe_instances(InstanceIds=[iid for iid, _, _ in new])
        info = {i["InstanceId"]: i for r in res["Reservations"] for i in r["Instances"]}
        for iid, role, lifecycle in new:
            inst = info.get(iid)
            if inst is None or not inst.get("PrivateIpAddress"):
                continue  # no address yet: next round
            instance = Instance(iid, inst["PrivateIpAddress"], lifecycle,
                                inst.get("InstanceType", ""))
            t = time.monotonic()
            node = self.boot(instance, role)
            self.record("node-booted", iid, role,
                        f"{role} {iid} ({instance.address}) launched by its group: booted from "
                        f"its launch template's user data (agent pid {node.agent_pid})",
                        boot_s=round(time.monotonic() - t, 2), address=instance.address,
                        warm=lifecycle.startswith("Warmed"))

    def systemd(self, now: float) -> None:
        """Every running machine's systemd restarts the units that ended (their policy)."""
        for node in self.nodes():
            for unit in node.restart_units(now):
                self.record("unit-restarted", node.instance_id, node.role,
                            f"systemd on {node.instance_id} ({node.address}): {unit} ended, "
                            "started again (Restart= of its unit)")

    # -- waiting -----------------------------------------------------------------------------
    def run_until(self, done: Callable[[], object], timeout: float, what: str,
                  tick: float = TICK_SECONDS) -> object:
        """Tick until ``done()`` is truthy (returned); TimeoutError naming ``what``."""
        deadline = time.monotonic() + timeout
        while True:
            self.tick(force=True)
            result = done()
            if result:
                return result
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{what}: not within {timeout:.0f} s")
            time.sleep(tick)
