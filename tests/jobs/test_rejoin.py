"""An elastic managed job restarts on its survivors at once and grows back: the supervisor
acting on ``choose_world``'s survivors-now, and a replacement gated, admitted and seen
joining the running attempt (injected gate, fake executors: no nodes, no AWS); the
executor side waits for the admission before it joins."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import pytest

from bootstrap_scripts.jobs.controller import attempts, rejoin, supervise
from bootstrap_scripts.jobs.controller.supervise import JobSupervisor
from bootstrap_scripts.jobs.engine import managed
from bootstrap_scripts.jobs.engine.restart_policy import World
from bootstrap_scripts.jobs.executor.elastic import ElasticJoins
from bootstrap_scripts.jobs.executor.node import ThisNode
from bootstrap_scripts.jobs.executor.probation import RunnerProbation
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.jobs import JobSpec, Proc, Share
from bootstrap_scripts.protocol.managed_records import ManagedRequest
from bootstrap_scripts.protocol.paths import ClusterPaths, NodePaths
from bootstrap_scripts.protocol.records import ShareStarted
from bootstrap_scripts.protocol.run_request import RunRequest
from tests.support.rejoin import (
    REPLACEMENT,
    FakeExecutors,
    W,
    grown,
    live,
    membership,
    restarted_job,
    supervisor,
)


def drain_w2(efs: Path) -> None:
    """The master's drain record for the worker 10.0.1.2 (a scale-in, not a loss)."""
    from bootstrap_scripts.protocol import state
    from bootstrap_scripts.protocol.state import DrainRecord

    now = time.time()
    state.write_drain(efs, DrainRecord(
        instance_id="i-w2", address="10.0.1.2", requested_at=now, deadline=now + 120,
        asg="workers", role="worker", lifecycle_hook="drain", lifecycle_action_token="t",
        member=True))


@pytest.fixture(autouse=True)
def fast_polls(monkeypatch):
    monkeypatch.setattr(supervise, "POLL_SECONDS", 0.01)


def test_an_elastic_job_restarts_on_three_of_four_nodes_at_once(tmp_path):
    live(tmp_path, membership(3, *W))
    sup = supervisor(tmp_path, elastic=True)
    sup.executors = FakeExecutors({"10.0.0.4", "10.0.1.1", "10.0.1.2"})  # 10.0.1.3 lost
    chosen = sup.choose_nodes()
    assert chosen is not None, "the elastic job waited for the replacement"
    assert [n.address for n in chosen[1]] == ["10.0.0.4", "10.0.1.1", "10.0.1.2"]
    assert sup.choice is not None and sup.choice.world is World.SURVIVORS_NOW
    assert sup.choice.reason.startswith("restarting on 3 of 4 node(s) now")


def test_a_job_that_is_not_elastic_still_waits_for_the_replacement(tmp_path):
    live(tmp_path, membership(3, *W))
    sup = supervisor(tmp_path, elastic=False, polls=5)
    sup.executors = FakeExecutors({"10.0.0.4", "10.0.1.1", "10.0.1.2"})
    assert sup.choose_nodes() is None  # still waiting when the controller stopped
    assert sup.choice is None






def test_a_replacement_that_passes_the_gate_is_admitted_and_the_job_grows_back(tmp_path):
    gated = []
    sup, grow = grown(tmp_path, lambda root, efs, m, addresses: gated.append(addresses) or [])
    sup.grow(grow)
    assert gated == [["10.0.1.9"]]  # only the replacement: not the excluded node
    assert store.exists(grow.jpaths.admitted("10.0.1.9"))
    (rec,) = sup.job.restart_log
    assert (rec.admitted_instance_ids, rec.joined_at, sup.job.world_size) == ("i-r", None, 3)
    # its executor joined: the share's start record appears; the job is back at 4
    store.write_record(grow.jpaths.started(4), ShareStarted(rank=4, address="10.0.1.9",
                                                            started_at=time.time()))
    sup.grow(grow)
    assert gated == [["10.0.1.9"]]  # admitted once, never gated again
    assert sup.job.world_size == 4 and sup.job.restart_log[0].joined_at is not None
    assert managed.load_job(sup.paths).restart_log[0].admitted_instance_ids == "i-r"


def test_a_replacement_failing_the_gate_is_marked_excluded_and_never_admitted(tmp_path):
    sup, grow = grown(tmp_path, lambda root, efs, m, addresses: [
        ("10.0.1.9", "", "gpus: 4 (expected 8)")])
    sup.grow(grow)
    assert not store.exists(grow.jpaths.admitted("10.0.1.9"))
    assert sup.health.marked == ["i-r"] and "i-r" in sup.job.excluded
    assert sup.job.world_size == 3 and grow.admitted == {}


@pytest.mark.parametrize(("running", "excluded", "alive", "admitted", "want"), [
    ({"10.0.0.4", "10.0.1.1"}, (), {"10.0.1.9"}, (), ["10.0.1.9"]),
    ({"10.0.0.4", "10.0.1.1"}, ("i-r",), {"10.0.1.9"}, (), []),  # excluded
    ({"10.0.0.4", "10.0.1.1"}, (), set(), (), []),  # executor not alive (yet)
    ({"10.0.0.4", "10.0.1.1"}, (), {"10.0.1.9"}, ("10.0.1.9",), []),  # admitted already
    ({"10.0.1.1"}, (), {"10.0.0.4", "10.0.1.9"}, (), ["10.0.1.9"]),  # never the master
])
def test_joiners(running, excluded, alive, admitted, want):
    m = membership(2, W[0], REPLACEMENT)
    got = rejoin.joiners(m, running=running, excluded=excluded, alive=alive,
                         admitted=admitted)
    assert [n.address for n in got] == want


@pytest.mark.parametrize("elastic", [True, False])
def test_an_attempt_of_an_elastic_job_asks_for_admission(tmp_path, elastic):
    req = ManagedRequest(job_id="j", run=RunRequest(job_id="j", command=("true",),
                                                    elastic=elastic), submitted_at=1.0)
    run = attempts.attempt_request(req, attempt_id="j.2", efs=tmp_path, restart_count=1,
                                   user="u")
    assert run.join_admission is elastic


class FakeShares:
    def __init__(self) -> None:
        self.started: list[Share] = []

    def start(self, spec, share, paths) -> bool:
        self.started.append(share)
        return True

    def credentials_ready(self, paths) -> bool:
        return True  # no job role: nothing to wait for


def test_a_replacement_executor_joins_only_once_admitted(tmp_path):
    node = ThisNode(NodePaths(tmp_path / "node"), ClusterPaths(tmp_path), address="10.0.1.9")
    m = membership(5, W[0], REPLACEMENT)
    node.paths.membership.parent.mkdir(parents=True)
    store.atomic_write(node.paths.membership, m.to_json())
    paths = ClusterPaths(tmp_path).job("j.2")
    paths.nodes.mkdir(parents=True)
    spec = JobSpec(job_id="j.2", launcher="torchrun", elastic=True, generation=4,
                   join_admission=True,
                   shares=(Share(0, "10.0.0.4", (Proc(argv=("torchrun",)),)),),
                   join_template=Proc(argv=("torchrun", "--local-addr", "{address}")))
    store.atomic_write(paths.spec, spec.to_json())
    shares = FakeShares()
    joins = ElasticJoins(node, shares)  # type: ignore[arg-type]
    joins.probation.check = lambda *a: RunnerProbation.ALIVE  # the runner beats
    joins.wait(spec, paths)
    joins.join(draining=False)
    assert shares.started == [] and paths.key in joins.waiting  # not admitted: still waiting
    paths.admitted_dir.mkdir()
    store.atomic_write(paths.admitted("10.0.1.9"), "i-r passed the health gate\n")
    joins.join(draining=False)
    assert [(s.rank, s.address) for s in shares.started] == [(1, "10.0.1.9")]
    # a spec without join_admission (dl-run --elastic by hand) joins as before
    plain = dataclasses.replace(spec, job_id="k.1", join_admission=False)
    kpaths = ClusterPaths(tmp_path).job("k.1")
    kpaths.nodes.mkdir(parents=True)
    store.atomic_write(kpaths.spec, plain.to_json())
    joins.wait(plain, kpaths)
    joins.join(draining=False)
    assert len(shares.started) == 2


@pytest.mark.parametrize(("admitted", "joined_at", "says"), [
    ("", None, "restarted on 3 of 4 node(s) at once (elastic); the replacement joins when "
               "ready"),
    ("i-r", None, "replacement i-r passed the health gate and is joining"),
    ("i-r", 1700000000.0, "replacement i-r passed the health gate and joined 20"),
])
def test_dl_jobs_show_says_on_how_many_nodes_and_that_the_replacement_joins(
        capsys, tmp_path, admitted, joined_at, says):
    from bootstrap_scripts.jobs.cli import dl_jobs

    job = dataclasses.replace(restarted_job(), restart_log=(dataclasses.replace(
        restarted_job().restart_log[0], admitted_instance_ids=admitted,
        joined_at=joined_at),))
    dl_jobs.print_show(job, as_json=False, efs=tmp_path)
    assert says in capsys.readouterr().out


def test_a_new_executor_is_seen_moving_with_real_heartbeats(tmp_path):
    """The supervisor's real observer (``reachability.Executors``), not the fake: looked at
    every :data:`rejoin.LOOK_SECONDS`, a replacement's beating executor is found alive (a
    look interval past the liveness rule's freshness window would never prove it)."""
    from bootstrap_scripts.jobs.engine.reachability import Executors
    from bootstrap_scripts.protocol.records import ExecutorHeartbeat

    beat = ClusterPaths(tmp_path).executor_heartbeat("10.0.1.9")
    beat.parent.mkdir(parents=True)
    clock = [0.0]
    executors = Executors(tmp_path, clock=lambda: clock[0])
    m = membership(2, W[0], REPLACEMENT)
    found = []
    for seq in range(1, 5):  # the executor beats once per look interval
        store.write_record(beat, ExecutorHeartbeat(address="10.0.1.9", heartbeat=seq,
                                                   seq=seq))
        found = rejoin.joiners(m, running={"10.0.0.4", "10.0.1.1"}, excluded=(),
                               alive=executors.alive(["10.0.1.9"]), admitted=())
        clock[0] += rejoin.LOOK_SECONDS + 0.5  # the supervisor's poll adds up to 0.5 s
    assert [n.address for n in found] == ["10.0.1.9"]


def test_a_re_attaching_controller_does_not_gate_an_admitted_node_again(tmp_path):
    gated = []
    sup, grow = grown(tmp_path, lambda root, efs, m, addresses: gated.append(addresses) or [])
    sup.grow(grow)
    successor = rejoin.Rejoin(grow.jpaths, os.geteuid(), os.getegid())
    assert successor.admitted == {"10.0.1.9": "i-r"}
    sup.grow(successor)
    assert gated == [["10.0.1.9"]]


def test_an_admission_planted_as_a_link_admits_nothing(tmp_path):
    from bootstrap_scripts.jobs.executor.elastic import admitted

    paths = ClusterPaths(tmp_path).job("j.2")
    paths.admitted_dir.mkdir(parents=True)
    target = tmp_path / "elsewhere"
    target.write_text("secret\n")
    paths.admitted("10.0.1.9").symlink_to(target)
    assert not admitted(paths, "10.0.1.9")
    assert rejoin.Rejoin(paths, os.geteuid(), os.getegid()).admitted == {}
    store.atomic_write(paths.admitted("10.0.1.8"), "i-r passed the health gate\n")
    assert admitted(paths, "10.0.1.8")


def test_nodes_joining_past_the_first_size_count_in_the_world_size(tmp_path):
    """A scale-up while the elastic attempt runs: the record says what runs (5 nodes), not
    the first size (4) it was capped at."""
    sup, grow = grown(tmp_path, lambda root, efs, m, addresses: [])
    sup.last_nodes_addresses = {"10.0.0.4", "10.0.1.1", "10.0.1.2", "10.0.1.3"}
    sup.update(world_size=4, excluded=())
    grow.admitted.update({"10.0.1.9": "i-r"})
    store.write_record(grow.jpaths.started(4), ShareStarted(rank=4, address="10.0.1.9",
                                                            started_at=time.time()))
    sup.grow(grow)
    assert sup.job.world_size == 5 and managed.load_job(sup.paths).world_size == 5


def test_a_node_lost_while_the_generation_rises_is_recorded_and_leaves_the_world(tmp_path):
    """A worker killed as a replacement is admitted: its loss is recorded, and the world
    size is what trains on (the replacement counts once its share started)."""
    sup, grow = grown(tmp_path, lambda root, efs, m, addresses: [])
    sup.grow(grow)  # 10.0.1.9 admitted, not started yet
    sup.executors = FakeExecutors({"10.0.0.4", "10.0.1.1", "10.0.1.9"})  # 10.0.1.2 killed
    sup.mark_lost(grow)
    assert [x.address for x in sup.job.node_losses] == ["10.0.1.2"]
    assert sup.job.world_size == 2
    store.write_record(grow.jpaths.started(4), ShareStarted(rank=4, address="10.0.1.9",
                                                            started_at=time.time()))
    sup.grow(grow)
    assert sup.job.world_size == 3


def test_a_worker_lost_inside_an_elastic_attempt_is_marked_unhealthy_at_once(tmp_path, capsys):
    """The attempt trains on without the worker (torchrun re-rendezvouses) and never ends to
    report it: the controller's own look at the attempt's executors marks the instance."""
    sup, grow = grown(tmp_path, lambda root, efs, m, addresses: [])
    sup.executors = FakeExecutors({"10.0.0.4", "10.0.1.1"})  # 10.0.1.2's executor is gone
    sup.mark_lost(grow)
    assert sup.health.marked == ["i-w2"]
    (loss,) = sup.job.node_losses
    assert (loss.attempt, loss.address, loss.instance_id, loss.marked_unhealthy) == (
        2, "10.0.1.2", "i-w2", True)
    assert "i-w2" in sup.job.excluded and "executor heartbeat lost" in loss.detail
    assert managed.load_job(sup.paths).node_losses == (loss,)
    sup.mark_lost(grow)  # seen once: never marked twice
    assert sup.health.marked == ["i-w2"] and len(sup.job.node_losses) == 1
    from bootstrap_scripts.jobs.cli import dl_jobs
    dl_jobs.print_show(sup.job, as_json=False, efs=tmp_path)
    assert "during attempt 2: 10.0.1.2 (i-w2), marked Unhealthy: executor heartbeat lost" in \
        capsys.readouterr().out


def test_a_lost_master_or_live_executors_mark_nothing_inside_an_elastic_attempt(tmp_path):
    sup, grow = grown(tmp_path, lambda root, efs, m, addresses: [])
    sup.mark_lost(grow)  # every executor alive
    assert sup.health.marked == [] and sup.job.node_losses == ()
    sup.executors = FakeExecutors({"10.0.1.1", "10.0.1.2"})  # the master's own: never marked
    sup.mark_lost(grow)
    (loss,) = sup.job.node_losses
    assert sup.health.marked == [] and not loss.marked_unhealthy
    assert "never marked" in loss.health_error


def test_a_node_drained_on_purpose_is_no_loss(tmp_path):
    """A scale-in (the master agent's drain request names the instance) stops the node's
    executor too: it left on purpose, nothing is marked."""
    sup, grow = grown(tmp_path, lambda root, efs, m, addresses: [])
    drain_w2(tmp_path)
    sup.executors = FakeExecutors({"10.0.0.4", "10.0.1.1"})
    sup.mark_lost(grow)
    assert sup.health.marked == [] and sup.job.node_losses == ()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def watched(tmp_path: Path, gate=None):
    """An elastic attempt (j.2) on four nodes whose ranks all reported step 40, its
    progress watched with a 10 s hang timeout on a stepped clock."""
    from bootstrap_scripts.jobs.controller import hangs
    from bootstrap_scripts.protocol.records import RankProgress

    sup, grow = grown(tmp_path, gate or (lambda root, efs, m, addresses: []))
    sup.rejoin, clock = grow, Clock()
    sup.watch = hangs.HangWatch(grow.jpaths, uid=os.geteuid(), gid=os.getegid(),
                                hang_timeout=10, clock=clock)
    grow.jpaths.progress_dir.mkdir(parents=True)
    for r in range(4):
        (grow.jpaths.progress_dir / f"{r}.json").write_text(
            RankProgress(rank=r, step=40, time=1.0).to_json())
    dumped = []
    sup.dump_stacks = lambda *a: dumped.append(a) or ({}, "dump")
    assert not sup.look_at_progress(sup.watch)  # first sight of step 40
    return sup, clock, dumped


def lose_a_worker(sup: JobSupervisor, clock: Clock, dumped: list) -> None:
    """10.0.1.2's executor is lost and the clock moves 11 s on (past the 10 s timeout):
    the look records the loss (which restarts the hang clock) and judges no hang."""
    sup.executors = FakeExecutors({"10.0.0.4", "10.0.1.1"})  # 10.0.1.2 lost
    clock.now += 11
    assert not sup.look_at_progress(sup.watch) and not dumped  # a loss, not a hang
    assert [x.address for x in sup.job.node_losses] == ["10.0.1.2"]


def test_survivors_restarting_after_a_loss_are_not_a_hang(tmp_path):
    """A worker lost: torchrun restarts the survivors' workers, whose start-up reports no
    step for longer than a short --hang-timeout. The loss (recorded first) restarts the
    hang clock: the old processes' reports are forgotten, the new ones' start-up is not a
    hang until it lasts 3 timeouts (a start-up that never reports is one)."""
    from bootstrap_scripts.jobs.engine.hang_rules import RESTART_GRACE_FACTOR

    sup, clock, dumped = watched(tmp_path)
    lose_a_worker(sup, clock, dumped)
    clock.now += 11  # the old files (step 40, written before the loss) do not count
    assert sup.watch.check() is None
    clock.now += RESTART_GRACE_FACTOR * 10 - 11  # no new process ever reported: a hang
    assert sup.look_at_progress(sup.watch)
    (m, *_rest), = dumped  # the stacks asked of the nodes still there, not the lost one
    assert "10.0.1.2" not in {n.address for n in m.nodes} and "10.0.1.1" in \
        {n.address for n in m.nodes}


class QuietExecutors(FakeExecutors):
    def __init__(self, up: set[str], quiet: set[str]) -> None:
        super().__init__(up | quiet)
        self.still = quiet

    def quiet(self, addresses, after):
        return [a for a in addresses if a in self.still]


def test_no_hang_is_judged_while_an_executor_may_be_lost(tmp_path):
    """The hang timeout ran out while a node's executor heartbeat stands still but is not
    called gone yet: its verdict comes first (a loss restarts the survivors)."""
    sup, clock, dumped = watched(tmp_path)
    sup.executors = QuietExecutors({"10.0.0.4", "10.0.1.1"}, {"10.0.1.2"})
    clock.now += 11
    assert not sup.look_at_progress(sup.watch) and not dumped
    sup.executors = QuietExecutors({"10.0.0.4", "10.0.1.1", "10.0.1.2"}, set())
    assert sup.look_at_progress(sup.watch) and dumped  # every executor alive: a hang


def test_a_node_drained_from_an_elastic_attempt_restarts_the_hang_clock_too(tmp_path):
    """A scale-in is no loss, but the others' workers restart without the node all the
    same: their start-up is no hang either."""
    sup, clock, dumped = watched(tmp_path)
    drain_w2(tmp_path)
    sup.executors = FakeExecutors({"10.0.0.4", "10.0.1.1"})
    clock.now += 11
    assert not sup.look_at_progress(sup.watch) and not dumped
    assert sup.job.node_losses == ()


def test_the_hang_clock_starts_at_the_new_processes_first_report(tmp_path):
    """After an elastic restart the timeout counts from the new processes' first report:
    their start-up took 25 s (more than the 10 s timeout), then they train; a rank that
    stops moving after that is a hang 10 s later, as before any restart."""
    from bootstrap_scripts.protocol.records import RankProgress

    sup, clock, dumped = watched(tmp_path)
    lose_a_worker(sup, clock, dumped)
    clock.now += 25  # start-up: no report yet, within the grace
    assert sup.watch.check() is None
    for r in range(3):  # the three survivors' new processes report step 38 (resumed)
        (sup.watch.jpaths.progress_dir / f"{r}.json").write_text(
            RankProgress(rank=r, step=38, time=clock.now).to_json())
    assert not sup.look_at_progress(sup.watch) and not dumped
    clock.now += 9
    assert sup.watch.check() is None
    clock.now += 2  # 11 s with no step after they started: a hang
    assert sup.look_at_progress(sup.watch)


def test_a_replaced_process_reporting_as_it_exits_does_not_start_the_clock(tmp_path):
    """A replaced worker that writes its last step as it exits (the progress reporter's
    atexit, on a clean exit) writes after the restart was recorded, but that is not the new
    processes' first report: only a new pid starts the clock."""
    from bootstrap_scripts.protocol.records import RankProgress

    def report(r: int, pid: int) -> None:
        (sup.watch.jpaths.progress_dir / f"{r}.json").write_text(
            RankProgress(rank=r, step=41, time=clock.now, pid=pid, host="n").to_json())

    sup, clock, dumped = watched(tmp_path)
    for r in range(4):  # the old processes, as the watch knows them (host, pid)
        report(r, 100 + r)
    assert not sup.look_at_progress(sup.watch)
    lose_a_worker(sup, clock, dumped)  # the loss restarts the clock (at 1011)
    clock.now += 1
    for r in range(3):  # the old processes exit, writing step 41 once more
        report(r, 100 + r)
    assert sup.watch.check() is None  # read as it is written (the controller polls)
    clock.now += 28  # the new processes' first report, still within the grace
    for r in range(3):
        report(r, 200 + r)
    assert sup.watch.check() is None
    clock.now += 5  # past the grace: 5 s since the new processes started, 33 s since exit
    assert sup.watch.check() is None and not dumped


def test_no_hang_is_judged_while_torchrun_may_restart_the_workers_again(tmp_path):
    """A loss, then a join: torchrun restarts the survivors' workers, which report, then
    restarts them again to take in the replacement (whose agent reaches the rendezvous
    seconds after the controller saw it join). The quiet stretch of that second restart,
    longer than the timeout, falls within the grace: no hang; after it, the usual rule."""
    from bootstrap_scripts.jobs.engine.hang_rules import RESTART_GRACE_FACTOR
    from bootstrap_scripts.protocol.records import RankProgress

    sup, clock, dumped = watched(tmp_path)
    lose_a_worker(sup, clock, dumped)  # the clock restarts at 1011
    restarted = clock.now
    clock.now += 3
    for r in range(3):  # the survivors' new processes report once, then are restarted
        (sup.watch.jpaths.progress_dir / f"{r}.json").write_text(
            RankProgress(rank=r, step=38, time=clock.now, pid=300 + r).to_json())
    assert sup.watch.check() is None
    clock.now += 16  # 16 s quiet (> the 10 s timeout), within the grace
    assert sup.watch.check() is None and not dumped
    clock.now = restarted + RESTART_GRACE_FACTOR * 10  # past it, still no step: a hang
    assert sup.look_at_progress(sup.watch)
