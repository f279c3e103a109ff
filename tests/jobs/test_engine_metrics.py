"""The job engine's own metrics (``controller/engine_facts.py`` read by ``controller/metrics.py``):
nodes joined, membership generation, jobs queued, cost so far (cluster and running job),
attempts and restarts per job, as the controller's cluster line carries them."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest

from bootstrap_scripts.jobs.controller.engine_facts import EngineFacts, Facts, priced_usd, tally
from bootstrap_scripts.jobs.controller.metrics import ControllerMetrics, Seen, cluster_line, decide
from bootstrap_scripts.jobs.engine import managed
from bootstrap_scripts.metrics import metric_names as names
from bootstrap_scripts.metrics import metrics_emf
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.managed_records import (
    AttemptUsage,
    ManagedJob,
    ManagedRequest,
    NodeUsage,
)
from bootstrap_scripts.protocol.membership import build_membership
from bootstrap_scripts.protocol.paths import (
    MANAGED_DIR,
    ClusterPaths,
    ManagedPaths,
    NodePaths,
    own_user,
)
from bootstrap_scripts.protocol.run_request import RunRequest

RATE = "1.2"  # USD an hour: one node-hour is 1.2 USD, one node-second 1/3000 USD


def node(i: int, rate: str = RATE) -> NodeUsage:
    return NodeUsage(instance_id=f"i-{i}", instance_type="g5.xlarge", market="on-demand",
                     usd_per_hour=rate, price_note="" if rate else "no Price List answer")


def job(job_id: str, state: str, *usage: AttemptUsage, attempt: int = 0) -> ManagedJob:
    return ManagedJob(job_id=job_id, state=state, submitted_at=1.0, usage=usage,
                      attempt=attempt, restarts=max(0, attempt - 1), user=own_user())


# -- pure ---------------------------------------------------------------------------------
def test_priced_usd_counts_priced_nodes_and_a_running_attempt_up_to_now() -> None:
    ended = AttemptUsage(attempt=1, started_at=0.0, ended_at=3600.0, nodes=(node(1), node(2)))
    running = AttemptUsage(attempt=2, started_at=4000.0, nodes=(node(1), node(3, rate="")))
    assert priced_usd([ended], now=9e9) == Decimal("2.4")           # 2 node-hours
    # the unpriced node counts for nothing; the running attempt runs until now
    assert priced_usd([ended, running], now=5800.0) == Decimal("2.4") + Decimal("0.6")
    assert priced_usd([], now=1.0) == 0


def test_tally_counts_queued_jobs_and_takes_the_running_jobs_fresh_ledger() -> None:
    me = own_user()  # the scan's keys are <user>/<id>: the running job's is its user's
    scanned = {f"{me}/a": ("succeeded", Decimal("2")), f"{me}/b": ("queued", Decimal(0)),
               f"{me}/c": ("queued", Decimal(0)), f"{me}/r": ("running", Decimal("0.1")),
               "other/r": ("queued", Decimal(0))}
    fresh = job("r", "running", AttemptUsage(attempt=1, started_at=0.0, nodes=(node(1),)))
    assert tally(scanned, None, now=3600.0) == (3, Decimal("2.1"))
    # another user's job of the same id is another job: still queued
    assert tally(scanned, fresh, now=3600.0) == (3, Decimal("3.2"))  # 2 + 1.2, not 0.1
    # the job just started: scanned while its record still said queued, it is not queued
    started = job("c", "running", AttemptUsage(attempt=1, started_at=0.0, nodes=(node(1),)))
    assert tally(scanned, started, now=3600.0) == (2, Decimal("3.3"))


@pytest.mark.parametrize("changes,now,due", [
    ((3, 2, 0, 1), 1.0, False),           # nothing changed: the minute's repeat
    ((4, 3, 0, 1), 1.0, True),            # a node joined (a new generation): at once
    ((3, 2, 1, 1), 1.0, True),            # a job queued: at once
    ((3, 2, 0, 2), 1.0, True),            # the running job's next attempt: at once
    ((3, 2, 0, 1), 50.0, True),
])
def test_a_membership_queue_or_attempt_change_is_written_at_once(changes, now, due) -> None:
    seen = Seen("", 0, 0.0, True, 0, (3, 2, 0, 1))
    assert (decide(seen, job_id="", restarts=0, now=now, changes=changes) is not None) == due


def test_the_cluster_line_records_each_fact_under_the_dashboards_dimensions() -> None:
    facts = Facts(nodes=3, generation=7, queued=2, cluster_usd=4.25, job_attempts=3,
                  job_usd=1.5)
    doc = json.loads(cluster_line(cluster="c1", job_id="j1", running=1, new=1, unhealthy=0,
                                  facts=facts, timestamp_ms=1))
    sets = {(m["Name"], tuple(dims)) for d in doc["_aws"]["CloudWatchMetrics"]
            for dims in d["Dimensions"] for m in d["Metrics"]}
    cluster, per_job = (names.DIM_CLUSTER,), (names.DIM_CLUSTER, names.DIM_JOB)
    assert sets == {
        (names.METRIC_JOBS_RUNNING, cluster), (names.METRIC_JOB_RESTARTS, cluster),
        (names.METRIC_UNHEALTHY_NODES, cluster), (names.METRIC_NODES_JOINED, cluster),
        (names.METRIC_MEMBERSHIP_GENERATION, cluster), (names.METRIC_JOBS_QUEUED, cluster),
        (names.METRIC_CLUSTER_COST, cluster), (names.METRIC_JOB_RESTARTS, per_job),
        (names.METRIC_JOB_ATTEMPTS, per_job), (names.METRIC_JOB_COST, per_job)}
    assert (doc[names.DIM_JOB], doc[names.METRIC_NODES_JOINED],
            doc[names.METRIC_MEMBERSHIP_GENERATION], doc[names.METRIC_JOBS_QUEUED],
            doc[names.METRIC_CLUSTER_COST], doc[names.METRIC_JOB_ATTEMPTS],
            doc[names.METRIC_JOB_COST]) == ("j1", 3, 7, 2, 4.25, 3, 1.5)
    # no job, nothing known yet: the cluster's three counts only, no JobId dimension
    idle = json.loads(cluster_line(cluster="c1", job_id="", running=0, new=0, unhealthy=0,
                                   facts=Facts(), timestamp_ms=1))
    assert names.DIM_JOB not in idle
    assert [m["Name"] for d in idle["_aws"]["CloudWatchMetrics"] for m in d["Metrics"]] == [
        names.METRIC_JOBS_RUNNING, names.METRIC_JOB_RESTARTS, names.METRIC_UNHEALTHY_NODES]


# -- reading the records ------------------------------------------------------------------
def submit(efs: Path, job_id: str, record: ManagedJob | None = None,
           where: Path | None = None) -> ManagedPaths:
    paths = ManagedPaths((where or ClusterPaths(efs).managed_dir) / own_user() / job_id)
    paths.dir.mkdir(parents=True)
    store.write_record(paths.request, ManagedRequest(
        job_id=job_id, run=RunRequest(job_id=job_id, command=("true",)), submitted_at=1.0))
    if record is not None:
        managed.save_job(paths, record)
    return paths


def write_membership(root: Path, workers: int, generation: int) -> None:
    path = NodePaths(root).membership
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(build_membership(
        cluster_id="c9", generation=generation,
        master={"instance_id": "i-0m", "address": "127.0.0.11"},
        workers=[{"instance_id": f"i-0w{i}", "address": f"127.0.0.{20 + i}"}
                 for i in range(workers)]).to_json())


def test_engine_facts_read_membership_queue_and_ledgers(tmp_path) -> None:
    root, efs = tmp_path / "node", tmp_path / "efs"
    facts = EngineFacts(root, efs, scan_seconds=50.0)
    assert facts.now(at=0.0, clock=0.0) == Facts(queued=0, cluster_usd=0.0)  # nothing yet
    write_membership(root, workers=2, generation=4)
    hour = AttemptUsage(attempt=1, started_at=0.0, ended_at=3600.0, nodes=(node(1), node(2)))
    done = submit(efs, "done-1", job("done-1", "succeeded", hour, attempt=1))
    submit(efs, "old-1", job("old-1", "failed", hour, attempt=1),
           where=ClusterPaths(efs).archive_dir / MANAGED_DIR)   # archived: still spent
    submit(efs, "wait-1")                                       # request only: queued
    submit(efs, "wait-2", job("wait-2", "queued"))
    running = job("run-1", "running", hour, AttemptUsage(
        attempt=2, started_at=7200.0, nodes=(node(1),)), attempt=2)
    submit(efs, "run-1", running)
    got = facts.now(running, at=10800.0, clock=100.0)
    # done-1, old-1: 2.4 each; run-1: 2.4 for attempt 1 and 1.2 for attempt 2's hour so far
    assert got == Facts(nodes=3, generation=4, queued=2, cluster_usd=8.4, job_attempts=2,
                        job_usd=3.6)
    # within the scan interval the records are not read again; the running job's ledger
    # and the membership are fresh
    submit(efs, "wait-3")
    write_membership(root, workers=3, generation=5)
    got = facts.now(running, at=14400.0, clock=120.0)
    assert (got.nodes, got.generation, got.queued) == (4, 5, 2)
    assert (got.job_usd, got.cluster_usd) == (4.8, 9.6)
    # a finished job's ledger is read once: a later change of its record is not seen; the
    # running job's end is (a scan at once, within the interval)
    managed.save_job(done, job("done-1", "succeeded", hour, hour, attempt=2))
    got = facts.now(None, at=14400.0, clock=130.0)
    assert (got.queued, got.cluster_usd) == (3, 9.6)  # run-1's scanned 4.8 in place
    assert (got.job_attempts, got.job_usd) == (0, None)


def lines(root: Path) -> list[dict]:
    return [json.loads(x) for x in metrics_emf.metrics_log(root).read_text().splitlines()]


def test_the_controllers_heartbeat_writes_the_engines_facts(tmp_path) -> None:
    from bootstrap_scripts.jobs.controller import daemon

    root, efs = tmp_path / "node", tmp_path / "efs"
    write_membership(root, workers=1, generation=2)
    (root / "var/log/dl-cluster").mkdir(parents=True)
    submit(efs, "wait-1")
    ctl = daemon.Controller(root, efs)
    ctl.beat(force=True)
    (doc,) = lines(root)
    assert (doc[names.DIM_CLUSTER], doc[names.METRIC_NODES_JOINED],
            doc[names.METRIC_MEMBERSHIP_GENERATION], doc[names.METRIC_JOBS_QUEUED],
            doc[names.METRIC_CLUSTER_COST]) == ("c9", 2, 2, 1, 0.0)
    write_membership(root, workers=2, generation=3)     # a node joined: a line at once
    ctl.last_beat = 0.0
    ctl.beat()
    assert [d[names.METRIC_NODES_JOINED] for d in lines(root)] == [2, 3]


def test_restarts_and_attempts_per_job_across_a_jobs_life(tmp_path) -> None:
    (tmp_path / "var/log/dl-cluster").mkdir(parents=True)
    m = ControllerMetrics(tmp_path, lambda: "c1")
    one = Facts(nodes=2, generation=1, queued=0, cluster_usd=0.0, job_attempts=1, job_usd=0.0)
    assert m.observe(job_id="j1", restarts=0, facts=one, now=0.0)
    two = Facts(nodes=2, generation=1, queued=0, cluster_usd=0.1, job_attempts=2, job_usd=0.1)
    assert m.observe(job_id="j1", restarts=1, facts=two, now=5.0)
    later = Facts(nodes=2, generation=1, queued=0, cluster_usd=0.3, job_attempts=2, job_usd=0.3)
    assert not m.observe(job_id="j1", restarts=1, facts=later, now=6.0)  # only its cost moved
    assert m.observe(job_id="j1", restarts=1, facts=later, now=7.0, final=True)  # it ended
    assert m.observe(job_id="", restarts=0, facts=Facts(2, 1, 0, 0.3), now=8.0)
    got = [(d.get(names.DIM_JOB), d[names.METRIC_JOB_RESTARTS], d.get(names.METRIC_JOB_ATTEMPTS),
            d.get(names.METRIC_JOB_COST)) for d in lines(tmp_path)]
    assert got == [("j1", 0, 1, 0.0), ("j1", 1, 2, 0.1), ("j1", 0, 2, 0.3),
                   (None, 0, None, None)]


def test_a_job_that_ends_gets_a_last_line_with_its_ledger(tmp_path) -> None:
    """``Controller.run_job``: however short the job, its last attempts and cost go out
    when it ends (the supervisor faked: one attempt of one priced node, 36 s)."""
    from types import SimpleNamespace

    from bootstrap_scripts.jobs.controller import daemon

    root, efs = tmp_path / "node", tmp_path / "efs"
    write_membership(root, workers=1, generation=2)
    (root / "var/log/dl-cluster").mkdir(parents=True)
    ctl = daemon.Controller(root, efs)
    ran = job("j1", "succeeded", AttemptUsage(attempt=1, started_at=0.0, ended_at=36.0,
                                              nodes=(node(1),)), attempt=1)
    sup = SimpleNamespace(job=job("j1", "queued"), watch=None)

    def run(reattach: bool = False) -> None:
        sup.job = ran

    sup.run = run
    ctl.run_job(sup)  # type: ignore[arg-type]
    per_job = [d for d in lines(root) if names.DIM_JOB in d]
    assert [(d[names.METRIC_JOB_ATTEMPTS], d[names.METRIC_JOB_COST])
            for d in per_job if names.METRIC_JOB_ATTEMPTS in d] == [(1, 0.012)]
