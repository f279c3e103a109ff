"""The job controller's metrics (bootstrap_scripts/jobs/controller/metrics.py): JobsRunning
and JobRestarts as EMF lines, written when they change and at least once a minute."""

from __future__ import annotations

import json

import pytest

from bootstrap_scripts.jobs.controller.metrics import (
    PROGRESS_SECONDS,
    REPEAT_SECONDS,
    ControllerMetrics,
    Seen,
    decide,
    progress_metrics,
    unhealthy_nodes,
)
from bootstrap_scripts.metrics import metric_names as names
from bootstrap_scripts.metrics import metrics_emf
from bootstrap_scripts.protocol.records import RankProgress


@pytest.mark.parametrize("seen,job,restarts,now,expected", [
    (Seen(), "", 0, 0.0, (0, 0, 0)),                           # first word: 0 running
    (Seen("", 0, 0.0, True), "", 0, 1.0, None),                 # nothing changed
    (Seen("", 0, 0.0, True), "", 0, REPEAT_SECONDS, (0, 0, 0)),  # the minute's point
    (Seen("j1", 0, 0.0, True), "j1", 0, 1.0, None),
    (Seen("j1", 0, 0.0, True), "j1", 2, 1.0, (1, 2, 0)),        # two restarts since
    (Seen("j1", 3, 0.0, True), "j1", 3, 1.0, None),
    (Seen("j1", 3, 0.0, True), "", 0, 1.0, (0, 0, 0)),          # the job ended
    (Seen("", 0, 0.0, True), "j2", 5, 1.0, (1, 0, 0)),           # earlier restarts: not ours
])
def test_decide(seen, job, restarts, now, expected) -> None:
    assert decide(seen, job_id=job, restarts=restarts, now=now) == expected


@pytest.mark.parametrize("seen,unhealthy,now,expected", [
    (Seen("j1", 0, 0.0, True, 0), 1, 1.0, (1, 0, 1)),       # a node marked: at once
    (Seen("j1", 0, 0.0, True, 1), 1, 1.0, None),            # still 1: the minute's repeat
    (Seen("j1", 0, 0.0, True, 1), 1, REPEAT_SECONDS, (1, 0, 1)),
    (Seen("j1", 0, 0.0, True, 1), 0, 1.0, (1, 0, 0)),       # replaced: at once
])
def test_decide_writes_a_change_of_unhealthy_nodes_at_once(seen, unhealthy, now,
                                                           expected) -> None:
    assert decide(seen, job_id="j1", restarts=0, now=now, unhealthy=unhealthy) == expected


@pytest.mark.parametrize("members,marked,excluded,expected", [
    (["i-m", "i-1", "i-2"], [], [], 0),
    (["i-m", "i-1", "i-2"], ["i-1"], [], 1),                 # marked, not yet replaced
    (["i-m", "i-1", "i-2"], ["i-1"], ["i-1", "i-2"], 2),     # marked and excluded: once
    (["i-m", "i-3", "i-2"], ["i-1"], ["i-1"], 0),            # replaced: gone from the membership
    (["i-m", "i-1"], [""], ["", "i-9"], 0),                  # no id, not a member
])
def test_unhealthy_nodes_counts_flagged_members(members, marked, excluded, expected) -> None:
    assert unhealthy_nodes(members, marked, excluded) == expected


def lines(root) -> list[dict]:
    path = metrics_emf.metrics_log(root)
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_a_jobs_life_in_lines(tmp_path) -> None:
    (tmp_path / "var/log/dl-cluster").mkdir(parents=True)
    m = ControllerMetrics(tmp_path, lambda: "c1")
    assert m.observe(job_id="", restarts=0, now=0.0)
    assert not m.observe(job_id="", restarts=0, now=1.0)
    assert m.observe(job_id="j1", restarts=1, now=2.0)   # resumed with 1 restart already
    assert not m.observe(job_id="j1", restarts=1, now=3.0)
    assert m.observe(job_id="j1", restarts=2, now=4.0)   # restarted by this controller
    assert m.observe(job_id="", restarts=0, now=5.0)
    assert m.observe(job_id="", restarts=0, unhealthy=1, now=6.0)
    assert not m.observe(job_id="", restarts=0, unhealthy=1, now=7.0)
    got = [(d[names.METRIC_JOBS_RUNNING], d[names.METRIC_JOB_RESTARTS],
            d[names.METRIC_UNHEALTHY_NODES], d["job"]) for d in lines(tmp_path)]
    assert got == [(0, 0, 0, ""), (1, 0, 0, "j1"), (1, 1, 0, "j1"), (0, 0, 0, ""),
                   (0, 0, 1, "")]
    doc = lines(tmp_path)[0]
    assert doc[names.DIM_CLUSTER] == "c1"
    assert doc["_aws"]["CloudWatchMetrics"] == [{
        "Namespace": names.NAMESPACE, "Dimensions": [[names.DIM_CLUSTER]],
        "Metrics": [{"Name": names.METRIC_JOBS_RUNNING, "Unit": "Count"},
                    {"Name": names.METRIC_JOB_RESTARTS, "Unit": "Count"},
                    {"Name": names.METRIC_UNHEALTHY_NODES, "Unit": "Count"}]}]


def test_no_cluster_id_or_no_file_writes_nothing_and_retries(tmp_path) -> None:
    cluster = {"id": ""}
    m = ControllerMetrics(tmp_path, lambda: cluster["id"])
    assert not m.observe(job_id="j1", restarts=0, now=0.0)
    cluster["id"] = "c1"
    assert not m.observe(job_id="j1", restarts=0, now=1.0)  # no var/log/dl-cluster yet
    (tmp_path / "var/log/dl-cluster").mkdir(parents=True)
    assert m.observe(job_id="j1", restarts=0, now=2.0)
    assert [d[names.METRIC_JOBS_RUNNING] for d in lines(tmp_path)] == [1]


def ranks(step: int, **figures) -> dict[int, RankProgress]:
    return {0: RankProgress(rank=0, step=step, time=1.0, loss=2.0, samples_per_s=100.0,
                            step_seconds=0.5),
            1: RankProgress(rank=1, step=step, time=1.0, **figures)}


def test_progress_metrics_mean_step_time_summed_rate_mean_loss() -> None:
    assert progress_metrics(ranks(7, loss=1.0, samples_per_s=50.0, step_seconds=1.5)) == {
        names.METRIC_STEP_TIME: (1.0, "Seconds"),
        names.METRIC_SAMPLES_PER_SECOND: (150.0, "Count/Second"),
        names.METRIC_LOSS: (1.5, "None")}
    # a rank without figures, or with a non-finite loss, is left out of them
    assert progress_metrics(ranks(7, loss=float("nan"))) == {
        names.METRIC_STEP_TIME: (0.5, "Seconds"),
        names.METRIC_SAMPLES_PER_SECOND: (100.0, "Count/Second"),
        names.METRIC_LOSS: (2.0, "None")}
    assert progress_metrics({1: RankProgress(rank=1, step=3, time=1.0)}) == {}


def test_a_progress_line_per_job_only_while_steps_move(tmp_path) -> None:
    (tmp_path / "var/log/dl-cluster").mkdir(parents=True)
    m = ControllerMetrics(tmp_path, lambda: "c1")
    assert m.observe_progress("j1", ranks(1), now=0.0)
    assert not m.observe_progress("j1", ranks(2), now=1.0)                 # too soon
    assert m.observe_progress("j1", ranks(2), now=PROGRESS_SECONDS)
    assert not m.observe_progress("j1", ranks(2), now=3 * PROGRESS_SECONDS)  # no step moved
    assert not m.observe_progress("", ranks(3), now=4 * PROGRESS_SECONDS)    # no job
    docs = lines(tmp_path)
    assert [d["step"] for d in docs] == [1, 2]
    assert docs[0][names.DIM_JOB] == "j1" and docs[0][names.DIM_CLUSTER] == "c1"
    assert docs[0]["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [
        [names.DIM_CLUSTER, names.DIM_JOB]]
    assert docs[0][names.METRIC_STEP_TIME] == 0.5


def test_the_controllers_heartbeat_writes_the_job_metrics_with_the_clusters_id(tmp_path):
    from bootstrap_scripts.jobs.controller import daemon
    from bootstrap_scripts.protocol.membership import build_membership
    from bootstrap_scripts.protocol.paths import NodePaths

    root = tmp_path / "node"
    ctl = daemon.Controller(root, tmp_path / "efs")
    assert ctl.cluster_id() == ""
    path = NodePaths(root).membership
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(build_membership(
        cluster_id="c9", generation=1, workers=[],
        master={"instance_id": "i-0mmm", "address": "127.0.0.11"}).to_json())
    (root / "var/log/dl-cluster").mkdir(parents=True)
    ctl.beat(force=True)
    assert [(d[names.DIM_CLUSTER], d[names.METRIC_JOBS_RUNNING]) for d in lines(root)] == [
        ("c9", 0)]


def test_unhealthy_nodes_are_the_members_the_controller_marked_or_its_job_excluded(
        tmp_path, monkeypatch) -> None:
    """The heartbeat's ``UnhealthyNodes``: 0 while nothing is flagged; a worker marked
    through SetInstanceHealth counts while it is a member, and so does one the running job
    excluded; a marked instance that left the membership (replaced) does not."""
    from types import SimpleNamespace

    from bootstrap_scripts.jobs.controller import daemon
    from bootstrap_scripts.jobs.controller.instance_health import InstanceHealth
    from bootstrap_scripts.protocol.membership import build_membership
    from bootstrap_scripts.protocol.paths import NodePaths

    calls = []

    class Asg:
        def set_instance_health(self, **kwargs) -> None:
            calls.append(kwargs)

    root = tmp_path / "node"
    health = InstanceHealth("us-east-1")
    monkeypatch.setattr(health, "client", lambda: Asg())
    ctl = daemon.Controller(root, tmp_path / "efs", health=health)
    path = NodePaths(root).membership
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(build_membership(
        cluster_id="c9", generation=1,
        workers=[{"instance_id": "i-0w1", "address": "127.0.0.12"},
                 {"instance_id": "i-0w2", "address": "127.0.0.13"}],
        master={"instance_id": "i-0mmm", "address": "127.0.0.11"}).to_json())
    (root / "var/log/dl-cluster").mkdir(parents=True)
    ctl.beat(force=True)
    assert health.mark_unhealthy("i-0w1") == "" and calls[0]["InstanceId"] == "i-0w1"
    assert health.mark_unhealthy("i-0gone") == ""   # already replaced: not a member
    ctl.beat(force=True)
    ctl.sup = SimpleNamespace(job=SimpleNamespace(job_id="j1", user="ann", restarts=0,
                                                  excluded=("i-0w2",), attempt=1, usage=()),
                              watch=None)
    ctl.job_id = "j1"
    ctl.beat(force=True)
    assert [d[names.METRIC_UNHEALTHY_NODES] for d in lines(root)] == [0, 1, 2]


def test_a_final_progress_line_skips_the_wait_but_not_the_moved_rule(tmp_path) -> None:
    (tmp_path / "var/log/dl-cluster").mkdir(parents=True)
    m = ControllerMetrics(tmp_path, lambda: "c1")
    assert m.observe_progress("j1", ranks(1), now=0.0)
    assert not m.observe_progress("j1", ranks(9), now=1.0)
    assert m.observe_progress("j1", ranks(9), now=1.0, final=True)
    assert not m.observe_progress("j1", ranks(9), now=2.0, final=True)  # nothing moved


def test_a_job_shorter_than_the_progress_interval_gets_its_step_time(tmp_path) -> None:
    """A rank's first report has a loss but no step time or rate yet; the controller's
    first line (at the first step it sees) therefore has only ``Loss``. When the attempt
    ends, its last figures go out at once: a short job's graphs get ``StepTime`` and
    ``SamplesPerSecond`` too, rather than nothing until a 15 s wait that never comes."""
    from types import SimpleNamespace

    from bootstrap_scripts.jobs.controller import daemon
    from bootstrap_scripts.jobs.controller.hangs import HangWatch
    from bootstrap_scripts.protocol.membership import build_membership
    from bootstrap_scripts.protocol.paths import ClusterPaths, NodePaths

    root = tmp_path / "node"
    ctl = daemon.Controller(root, tmp_path / "efs")
    path = NodePaths(root).membership
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(build_membership(cluster_id="c9", generation=1, workers=[], master={
        "instance_id": "i-0mmm", "address": "127.0.0.11"}).to_json())
    (root / "var/log/dl-cluster").mkdir(parents=True)
    watch = HangWatch(ClusterPaths(tmp_path / "efs").job("j1.1"), uid=-1, gid=-1,
                      hang_timeout=0)
    first = {0: RankProgress(rank=0, step=1, time=1.0, loss=2.3)}

    def run(reattach: bool = False) -> None:
        watch.records = first
        ctl.beat(force=True)   # the first step: a Loss-only line
        watch.records = ranks(40)  # 2 s later the attempt ended

    sup = SimpleNamespace(job=SimpleNamespace(job_id="j1", user="ann", restarts=0, excluded=(),
                                              attempt=1, usage=()),
                          watch=watch, run=run)
    ctl.run_job(sup)  # type: ignore[arg-type]
    progress = [d for d in lines(root) if "step" in d]  # not the cluster line
    assert [sorted(k for k in d if k in (names.METRIC_STEP_TIME, names.METRIC_LOSS,
                                          names.METRIC_SAMPLES_PER_SECOND)) for d in progress] \
        == [[names.METRIC_LOSS],
            [names.METRIC_LOSS, names.METRIC_SAMPLES_PER_SECOND, names.METRIC_STEP_TIME]]
    assert ctl.sup is None and ctl.watched is None


def test_a_new_jobs_first_steps_are_written_even_if_they_equal_the_last_jobs(tmp_path) -> None:
    (tmp_path / "var/log/dl-cluster").mkdir(parents=True)
    m = ControllerMetrics(tmp_path, lambda: "c1")
    assert m.observe_progress("j1", ranks(1), now=0.0)
    assert m.observe_progress("j2", ranks(1), now=1.0)
    assert [d[names.DIM_JOB] for d in lines(tmp_path)] == ["j1", "j2"]
