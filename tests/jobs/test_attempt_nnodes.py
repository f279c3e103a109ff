"""The hang watch asks the attempt's own ``--nnodes`` whether a join restarts the workers.

The launcher computes the range (``protocol.nnodes.node_range``) and publishes it in the
attempt's spec (``JobSpec.nnodes``), and the controller reads it back from there. An
elastic job given no ``--nnodes`` on a cluster of more than 64 nodes runs with MAX equal
to its node count. A default of 64 assumed elsewhere would take a join with 64 nodes in
for a spare's and give the restarting workers no grace. No nodes and no AWS here: a real
launch plan, its spec written to disk, the supervisor's ``grow`` with an injected gate.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from bootstrap_scripts.jobs.controller import attempts
from bootstrap_scripts.jobs.engine import launchers as ln
from bootstrap_scripts.jobs.engine.restart_policy import join_restarts_workers
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.jobs import JobSpec, JobSpecError
from bootstrap_scripts.protocol.membership import build_membership
from bootstrap_scripts.protocol.nnodes import NodeRange
from bootstrap_scripts.protocol.paths import ClusterPaths
from bootstrap_scripts.protocol.records import ShareStarted
from bootstrap_scripts.protocol.run_request import RunRequest
from tests.support.rejoin import FakeExecutors, grown

BIG = 70  # nodes: more than the elastic default MAX of 64


def big_membership(n: int = BIG):
    return build_membership(cluster_id="c", generation=1, master={
        "instance_id": "i-m", "address": "10.0.0.4"}, workers=[
        {"instance_id": f"i-{k}", "address": f"10.0.2.{k}"} for k in range(1, n)])


def spec_of(plan: ln.LaunchPlan, job_id: str = "j.2") -> JobSpec:
    """The spec ``run.run_job`` publishes for ``plan`` (the fields the controller reads)."""
    return JobSpec(job_id=job_id, launcher=plan.launcher, shares=plan.shares, elastic=True,
                   join_template=plan.join_template, nnodes=plan.nnodes)


def test_the_launcher_publishes_its_own_range_and_the_spec_keeps_it():
    m = big_membership()
    plan = ln.plan("torchrun", m, ["t.py"], ln.LaunchOptions(elastic=True))
    assert plan.nnodes == f"1:{BIG}"
    assert f"--nnodes=1:{BIG}" in plan.shares[0].procs[0].argv
    back = JobSpec.from_json(spec_of(plan).to_json())
    assert back.nnodes == f"1:{BIG}"
    fixed = ln.plan("torchrun", m, ["t.py"], ln.LaunchOptions(nnodes="3"))
    assert fixed.nnodes == "3"
    assert ln.plan("mpi", m, ["t.py"], ln.LaunchOptions()).nnodes == ""


@pytest.mark.parametrize("bad", ["0", "4:2", "x", "1:2:3"])
def test_a_spec_with_a_malformed_nnodes_is_refused_naming_it(bad):
    plan = ln.plan("torchrun", big_membership(2), ["t.py"], ln.LaunchOptions(elastic=True))
    text = spec_of(dataclasses.replace(plan, nnodes=bad)).to_json()
    with pytest.raises(JobSpecError, match=f"nnodes.*{bad}"):
        JobSpec.from_json(text)


def write_spec(jpaths, spec: JobSpec, *, without_nnodes: bool = False) -> None:
    data = json.loads(spec.to_json())
    if without_nnodes:  # a spec written before the field existed
        del data["nnodes"]
    jpaths.dir.mkdir(parents=True, exist_ok=True)
    store.atomic_write(jpaths.spec, json.dumps(data))


def test_the_controller_reads_the_attempts_range_an_older_spec_and_no_spec(tmp_path):
    jpaths = ClusterPaths(tmp_path).job("j.2")
    run = RunRequest(job_id="j", command=("t.py",), elastic=True)
    assert attempts.attempt_nnodes(jpaths, run, BIG) == NodeRange(1, BIG)  # no spec yet
    plan = ln.plan("torchrun", big_membership(), ["t.py"], ln.LaunchOptions(elastic=True))
    write_spec(jpaths, dataclasses.replace(spec_of(plan), nnodes="2:68"))
    assert attempts.attempt_nnodes(jpaths, run, 3) == NodeRange(2, 68)  # the spec's word
    write_spec(jpaths, spec_of(plan), without_nnodes=True)
    # an older spec: the launcher's rule on its own share count, not the count given
    assert attempts.attempt_nnodes(jpaths, run, 3) == NodeRange(1, BIG)
    asked = dataclasses.replace(run, nnodes="1:5")
    assert attempts.attempt_nnodes(jpaths, asked, 3) == NodeRange(1, 5)


class ClockWatch:
    """The hang watch as ``grow`` uses it: counts the restart graces given."""

    def __init__(self) -> None:
        self.restarts = 0

    def restart_clock(self) -> None:
        self.restarts += 1


@pytest.mark.parametrize(("members", "grace"), [(64, True), (BIG - 1, True), (BIG, False)])
def test_a_join_into_a_large_elastic_attempt_gives_the_grace_by_its_published_max(
        tmp_path, members, grace):
    """An attempt of an elastic job without --nnodes on 70 nodes (MAX 70, as its spec
    says): a replacement joining while ``members`` nodes are in restarts the workers unless
    all 70 are in. The request's own --nnodes is "" here, so only the spec knows MAX."""
    sup, grow = grown(tmp_path, lambda root, efs, m, addresses: [])
    sup.request = dataclasses.replace(sup.request, run=dataclasses.replace(
        sup.request.run, nnodes=""))
    plan = ln.plan("torchrun", big_membership(), ["t.py"], ln.LaunchOptions(elastic=True))
    write_spec(grow.jpaths, spec_of(plan))
    others = {f"10.0.2.{k}" for k in range(1, members - 2)}
    sup.last_nodes_addresses = {"10.0.0.4", "10.0.1.1", "10.0.1.2"} | others
    sup.executors = FakeExecutors(sup.last_nodes_addresses | {"10.0.1.9"})
    assert len(sup.last_nodes_addresses) == members
    sup.watch = watch = ClockWatch()
    sup.grow(grow)  # the replacement 10.0.1.9 is gated and admitted
    assert watch.restarts == 0
    store.write_record(grow.jpaths.started(members), ShareStarted(
        rank=members, address="10.0.1.9", started_at=1.0))
    sup.grow(grow)  # its share started: it joined
    assert grow.joined == {"10.0.1.9"}
    assert watch.restarts == int(grace)
    assert join_restarts_workers(NodeRange(1, BIG), members) is grace
