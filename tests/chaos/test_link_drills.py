"""Fault drills on a three-node gated cluster whose instances are Auto Scaling's: a bad link
while the health gate runs.

The cluster (``tests.support.cluster``): a master and two workers, their instances moto's
(``emulator.resources.create_cluster``, CPU instance type, so the gate expects no GPU), a
real ``dl-executor`` per node and the master's real ``dl-controller`` with the real health
gate before every attempt (its node checks and its all-reduce as real jobs through the
executors) and real Auto Scaling calls to the session's moto: a mark is
``SetInstanceHealth``, read back with ``DescribeAutoScalingInstances``. Each node's job
connections leave from its own address (``DEEPLEARNING_NODE_CONNECT=1``,
``tests/support/partition.py``), so a partition is the kernel dropping one node's packets
to another. Each drill leaves the cluster idle for the next, every rule deleted.
"""

from __future__ import annotations

import json
import pwd
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from bootstrap_scripts.jobs.engine import gate_identity
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.managed_records import ControllerHeartbeat
from bootstrap_scripts.protocol.paths import SHARE_STARTED_SUFFIX, ClusterPaths, NodePaths
from bootstrap_scripts.protocol.records import ShareStarted
from emulator.resources import create_cluster
from tests.chaos.drills import attempts, drill, leftovers, record, torchelastic_dirs, wait_for
from tests.conftest import REGION
from tests.support import partition
from tests.support.cluster import free_rdzv_port, start_local_cluster

pytestmark = pytest.mark.chaos
TERMINAL = ("succeeded", "failed", "cancelled")
HANG_JOB = str(Path(__file__).parent / "jobs" / "hang_at_step.py")
HANG_TIMEOUT = 10.0
#: how long the link stays down at most: the gate's verdicts come well within it
CUT_AT_MOST = 420.0


@pytest.fixture(scope="module")
def link_cluster(tmp_path_factory, moto_endpoint) -> Iterator:
    why = partition.why_not()
    assert not why, f"a partition cannot be made here: {why}"
    with pytest.MonkeyPatch.context() as mp:  # module-scoped: before the autouse creds
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            mp.setenv(name, "testing")
        mp.delenv("AWS_SESSION_TOKEN", raising=False)
        res = create_cluster(moto_endpoint, cluster_id="chaos-link", workers=2,
                             instance_type="c5.xlarge")
        instances = res.node_instances("master") + res.node_instances("worker")
    c = None
    try:
        c = start_local_cluster(tmp_path_factory.mktemp("link"), 3, instances=instances)
        for node in c.nodes:  # job connections leave from the node's own address
            node.env["DEEPLEARNING_NODE_CONNECT"] = "1"
        c.start_executors()
        c.start_controller({"AWS_ENDPOINT_URL": moto_endpoint, "AWS_REGION": REGION,
                            "AWS_DEFAULT_REGION": REGION, "AWS_ACCESS_KEY_ID": "testing",
                            "AWS_SECRET_ACCESS_KEY": "testing"}, health_gate=True)
        yield c
    finally:
        left: set[int] = set()
        if c is not None:
            c.stop()
            left = c.leftovers()
        assert not left, f"processes left behind: {sorted(left)}"


def owners() -> set[int]:
    """Who this cluster's job processes run as: root and the gate's user."""
    return {0, *(u.pw_uid for u in pwd.getpwall() if u.pw_name == gate_identity.NAME)}


def health(moto: str) -> dict[str, str]:
    """Auto Scaling's health of every instance it has (instance id -> healthy/unhealthy)."""
    asg = boto3.client("autoscaling", endpoint_url=moto, region_name=REGION,
                       aws_access_key_id="testing", aws_secret_access_key="testing")
    return {i["InstanceId"]: i["HealthStatus"].lower()
            for i in asg.describe_auto_scaling_instances()["AutoScalingInstances"]}


def replacements(efs: Path) -> tuple[float, ...]:
    """The marks the controller's circuit breaker counts (its heartbeat's)."""
    beat = store.read_record_or_none(ClusterPaths(efs).controller_heartbeat,
                                     ControllerHeartbeat)
    return tuple(beat.replacements) if beat is not None else ()


def test_a_one_way_link_during_a_hang_restart_marks_no_node(link_cluster, moto_endpoint):
    """(47.1) A torchrun job on master + 2 workers hangs (``--hang-timeout``); while the hang
    restart's health gate runs, worker 1's packets to the master are dropped (one way). The
    gate's all-reduce cannot complete: a collective's failure names a link, not a node, so
    the controller marks no instance (never the master), spends none of the replacement
    budget, and the job's record says why; after the heal the job runs to its end on the
    same three nodes."""
    c = link_cluster
    master, w1, _w2 = c.addresses
    ids = {n.address: n.instance_id for n in c.membership.nodes}
    with drill("one-way link during a hang restart", f"worker 1 -> master dropped (one way) "
               f"while the gate of a hang restart runs (--hang-timeout {HANG_TIMEOUT:g}, "
               "3 nodes)") as row:
        elastic = torchelastic_dirs()
        before = health(moto_endpoint)
        budget_before = replacements(c.efs)
        res = c.run("--detach", "--json", "--rdzv-port", free_rdzv_port(c), "--hang-timeout",
                    f"{HANG_TIMEOUT:g}", "--max-restarts", "2", "--", "python", HANG_JOB,
                    "--hang-at", "5", "--hang-rank", "1", "--steps", "15", managed=True,
                    timeout=60)
        assert res.returncode == 0, res.stdout
        job_id = json.loads(res.stdout.strip().splitlines()[-1])["job_id"]
        hang = ClusterPaths(c.efs).managed(job_id).attempt_hang(1)
        wait_for(f"job {job_id} to hang and be seen: {c.controller_log()[-2000:]}",
                 lambda: store.exists(hang) or ((r := record(c.efs, job_id))
                                                and r.state in TERMINAL), 300)
        with partition.partitioned(w1, master, one_way=True):
            t0 = time.monotonic()
            rec = wait_for(f"the gate's verdicts in job {job_id}'s record: "
                           f"{c.controller_log()[-2000:]}",
                           lambda: (r := record(c.efs, job_id)) and (
                               r.gate_failures or r.state in TERMINAL) and r, CUT_AT_MOST)
            during = record(c.efs, job_id)
            row.seconds = time.monotonic() - t0
        rec = wait_for(f"job {job_id} to end: {c.controller_log()[-2000:]}",
                       lambda: (r := record(c.efs, job_id)) and r.state in TERMINAL and r, 600)
        after = health(moto_endpoint)
        marked = sorted(i for i, h in after.items() if h == "unhealthy"
                        and before.get(i) != "unhealthy")
        ran = attempts(c.efs, job_id)
        row.did = (f"gate during the cut: {'; '.join(during.gate_failures)[:220] or 'no failure'}"
                   f"; marked {marked or 'none'}; restarts "
                   + ", ".join(f"{r.kind}@{r.attempt}" for r in rec.restart_log)
                   + f"; {rec.state} after {len(ran)} attempt(s) on {rec.world_size} node(s)")
        row.check("the gate met the cut", any("allreduce" in g for g in during.gate_failures),
                  row.did)
        row.check("master never marked", after.get(ids[master]) == "healthy", row.did)
        row.check("no mark without evidence", not marked and not rec.excluded,
                  f"marked {marked}, excluded {rec.excluded}; {c.controller_log()[-1500:]}")
        row.check("budget not spent", replacements(c.efs) == budget_before,
                  f"{replacements(c.efs)} vs {budget_before}")
        row.check("record says why", bool(rec.gate_failures) and all(
            "not marked" in g for g in rec.gate_failures), "; ".join(rec.gate_failures))
        row.check("record", rec.state == "succeeded" and rec.world_size == 3
                  and [r.kind for r in rec.restart_log] == ["hang"],
                  f"{rec.state}: {rec.message}")
        left = leftovers(c.efs, job_id, c.roots,
                         lambda root: NodePaths(root).share_status_dir, elastic,
                         owners=owners())
        row.check("nothing left", not left, "; ".join(left[:4]))


# -- a loss while an elastic job grows -----------------------------------------------------


def share_pgid(c, job_id: str, attempt: int, address: str) -> int:
    """The process group of ``address``'s share of ``attempt`` (its ``.started`` record)."""
    nodes = ClusterPaths(c.efs).job(f"{job_id}.{attempt}").nodes
    for _stem, rec in store.scan_records(nodes, ShareStarted, suffix=SHARE_STARTED_SUFFIX):
        if rec.address == address:
            return rec.pgid
    return 0


def test_a_loss_while_an_elastic_job_grows_is_recorded(link_cluster, moto_endpoint):
    """(47.4) An ``--elastic --nnodes 2:3`` job trains on the master and worker 1; worker 2
    enters the membership (a scale-up: the generation rises) and, once the controller has
    admitted it, worker 1 is lost as a machine is (its executor and share killed). The job
    trains on and ends; its record says what ran: the world size at the end (2: the master
    and worker 2), worker 1 lost, and the attempt's cost charged to the nodes that ran (worker
    2 included). Last in this module: it loses a node (restarted after, the membership
    restored)."""
    c = link_cluster
    master, w1, w2 = c.addresses
    ids = {n.address: n.instance_id for n in c.membership.nodes}
    with drill("loss during an elastic join", "worker 1 killed (executor and share) once "
               "the controller admitted worker 2 into a running --elastic --nnodes 2:3 "
               "job") as row:
        elastic = torchelastic_dirs()
        c.publish(2, [master, w1], "worker 2 not yet joined")
        NodePaths(c.roots[w2]).membership.unlink()
        try:
            res = c.run("--detach", "--json", "--elastic", "--nnodes", "2:3", "--rdzv-port",
                        free_rdzv_port(c), "--", "python", "-m",
                        "bootstrap_scripts.examples.train_digits",
                        "--epochs", "16", "--checkpoint-every", "2", "--step-delay", "0.2",
                        managed=True, timeout=60)
            assert res.returncode == 0, res.stdout
            job_id = json.loads(res.stdout.strip().splitlines()[-1])["job_id"]
            first = ClusterPaths(c.efs).job(f"{job_id}.1")
            wait_for(f"job {job_id}'s shares on 2 nodes: {c.controller_log()[-1500:]}",
                     lambda: share_pgid(c, job_id, 1, w1) and share_pgid(c, job_id, 1, master),
                     240)
            time.sleep(5)  # training, not starting
            c.publish(3, [master, w1, w2], "scale-up: worker 2 registered")
            wait_for(f"worker 2 admitted: {c.controller_log()[-1500:]}",
                     lambda: store.exists(first.admitted(w2))
                     or ((r := record(c.efs, job_id)) and r.state in TERMINAL), 300)
            c.node(w1).kill([share_pgid(c, job_id, 1, w1)])
            t0 = time.monotonic()
            rec = wait_for(f"job {job_id} to end: {c.controller_log()[-2000:]}",
                           lambda: (r := record(c.efs, job_id)) and r.state in TERMINAL and r,
                           600)
            row.seconds = time.monotonic() - t0
        finally:
            c.start_executors([w1])  # the machine back (a new one, as Auto Scaling's)
            c.publish(4, [master, w1, w2], "restored")
        last = rec.usage[-1] if rec.usage else None
        charged = sorted(n.instance_id for n in last.nodes) if last else []
        spans = {n.instance_id: (n.joined_at, n.left_at) for n in (last.nodes if last else ())}
        lost = [(x.address, x.instance_id) for x in rec.node_losses]
        names = {ids[master]: "master", ids[w1]: "w1", ids[w2]: "w2"}
        row.did = (f"{rec.state}; world size {rec.world_size}; lost {lost or 'none'}; "
                   f"attempt {rec.attempt} charged to "
                   + ", ".join(f"{names.get(i, i)}"
                               + (" from its join" if spans[i][0] else "")
                               + (" to its loss" if spans[i][1] else "") for i in charged)
                   + f"; restarts {len(rec.restart_log)}")
        row.check("record", rec.state == "succeeded", f"{rec.state}: {rec.message}")
        row.check("world size at the end", rec.world_size == 2, row.did)
        row.check("the lost node", lost == [(w1, ids[w1])], row.did)
        row.check("cost to the nodes that ran", ids[w2] in charged
                  and spans[ids[w2]][0] is not None and spans.get(ids[w1], (None, None))[1]
                  is not None and spans[ids[master]] == (None, None), row.did)
        left = leftovers(c.efs, job_id, c.roots,
                         lambda root: NodePaths(root).share_status_dir, elastic,
                         owners=owners())
        row.check("nothing left", not left, "; ".join(left[:4]))
