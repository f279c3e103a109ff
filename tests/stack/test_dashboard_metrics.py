"""Every metric the nodes publish has a graph on the cluster's dashboard, and every graph of
the cluster's namespace shows a metric the nodes publish, under the same dimension set.

The runtime side is not a list kept by hand: the EMF lines the two emitters
(``bootstrap_scripts/jobs/executor/gpu_sampler.py``, ``bootstrap_scripts/jobs/controller/
metrics.py``) actually write, for a GPU reporting every field and a job reporting every
figure, are parsed as CloudWatch Logs would (``_aws.CloudWatchMetrics``). The stack side is
the synthesized dashboard body: its metric arrays and its SEARCH expressions. Both name
their namespace and dimensions from ``bootstrap_scripts/metrics/metric_names.py``; a name typed
twice, a dimension set one side forgot, or a third emitter nobody graphed fails here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bootstrap_scripts.jobs.controller.engine_facts import Facts
from bootstrap_scripts.jobs.controller.metrics import ControllerMetrics
from bootstrap_scripts.jobs.executor.gpu_sampler import sample_line
from bootstrap_scripts.metrics import dcgm_metrics, efa_counters, gpu_metrics, metrics_emf
from bootstrap_scripts.metrics import metric_names as names
from bootstrap_scripts.protocol.records import RankProgress
from tests.stack.synth import REPO, cluster_template

#: A metric and the dimension names it is recorded under.
Series = tuple[str, frozenset[str]]
#: The modules that write EMF lines (a new one must be added to :func:`emitted` too).
EMITTERS = {"bootstrap_scripts/jobs/executor/gpu_sampler.py",
            "bootstrap_scripts/jobs/controller/metrics.py"}
SEARCH = re.compile(r"SEARCH\('\{(?P<schema>[^}]*)\} MetricName=\"(?P<name>[^\"]+)\"")


def series_of_line(line: str) -> set[tuple[str, Series]]:
    """(namespace, series) of every metric of an EMF line, per dimension set."""
    meta = json.loads(line)["_aws"]
    return {(d["Namespace"], (m["Name"], frozenset(dims)))
            for d in meta["CloudWatchMetrics"] for dims in d["Dimensions"] for m in d["Metrics"]}


def emitted(tmp_path: Path) -> set[tuple[str, Series]]:
    """What the nodes' emitters write: a GPU reporting every field, the controller's
    cluster line with every engine fact and a running job, and a job's progress with every
    figure."""
    readings = gpu_metrics.parse("0, 57, 1200, 61, 120.50, 0, No\n1, 43, 800, 58, 99.00, 1, Yes\n")
    efa = {metric: (1.0, unit) for metric, unit in efa_counters.COUNTERS.values()}
    profiling = dcgm_metrics.node_metrics({0: [0.5, 0.25, 0.75]})
    lines = [sample_line(readings, "c1", "i-0abc", 1_700_000_000_000, xids=1, efa=efa,
                         profiling=profiling) or ""]
    (tmp_path / "var/log/dl-cluster").mkdir(parents=True)
    ctl = ControllerMetrics(tmp_path, lambda: "c1")
    facts = Facts(nodes=3, generation=2, queued=1, cluster_usd=1.5, job_attempts=2, job_usd=0.5)
    assert ctl.observe(job_id="j1", restarts=0, unhealthy=1, facts=facts, now=0.0)
    progress = {r: RankProgress(rank=r, step=5, time=1.0, loss=0.7, samples_per_s=80.0,
                                step_seconds=0.4) for r in (0, 1)}
    assert ctl.observe_progress("j1", progress, now=0.0)
    lines += metrics_emf.metrics_log(tmp_path).read_text().splitlines()
    return {s for line in lines for s in series_of_line(line)}


def join(value: object) -> str:
    """A synthesized ``Fn::Join`` as text, each token (a Ref, the region) as ``TOKEN``."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and "Fn::Join" in value:
        sep, parts = value["Fn::Join"]
        return sep.join(p if isinstance(p, str) else "TOKEN" for p in parts)
    raise AssertionError(f"unexpected dashboard body {value!r}")


def graphed(body: dict) -> set[tuple[str, Series]]:
    """(namespace, series) of every metric and SEARCH the dashboard's graphs show."""
    out = set()
    for widget in body["widgets"]:
        for entry in widget.get("properties", {}).get("metrics", []):
            if isinstance(entry[0], dict):
                found = SEARCH.search(entry[0].get("expression", ""))
                assert found, f"{widget['properties']['title']}: not a SEARCH: {entry[0]}"
                namespace, *dims = found["schema"].split(",")
                out.add((namespace, (found["name"], frozenset(dims))))
            else:
                namespace, name, *rest = [e for e in entry if not isinstance(e, dict)]
                out.add((namespace, (name, frozenset(rest[0::2]))))
    return out


@pytest.fixture(scope="module")
def board() -> dict:
    (dashboard,) = cluster_template().find_resources("AWS::CloudWatch::Dashboard").values()
    return json.loads(join(dashboard["Properties"]["DashboardBody"]))


def test_the_emitters_are_the_ones_this_test_runs() -> None:
    writers = {str(p.relative_to(REPO)) for p in (REPO / "bootstrap_scripts").rglob("*.py")
               if "metrics_emf.render(" in p.read_text()}
    assert writers == EMITTERS


def test_every_emitted_metric_has_a_graph_and_every_graph_an_emitted_metric(
        board, tmp_path) -> None:
    runtime = emitted(tmp_path)
    assert {ns for ns, _s in runtime} == {names.NAMESPACE}
    # every name metric_names declares is emitted (none is declared for nothing)
    declared = {v for k, v in vars(names).items() if k.startswith("METRIC_")}
    assert {name for _ns, (name, _d) in runtime} == declared
    shown = {s for s in graphed(board) if s[0] == names.NAMESPACE}
    assert runtime - shown == set(), "emitted but not graphed"
    assert shown - runtime == set(), "graphed but never emitted"


def test_the_graphs_read_the_clusters_own_series(board) -> None:
    text = json.dumps(board)
    assert text.count(f'{names.DIM_CLUSTER}=\\"DLClusterStack\\"') >= 9  # every SEARCH
    for widget in board["widgets"]:
        for entry in widget.get("properties", {}).get("metrics", []):
            if not isinstance(entry[0], dict) and entry[0] == names.NAMESPACE:
                assert entry[2:4] == [names.DIM_CLUSTER, "DLClusterStack"], entry
