"""The cost ledger (``ops/cost``, pure), the price book (``ops/prices``, AWS faked), and the
controller's ``--max-cost`` stop (``controller/budget`` + ``supervise``), in process."""

from __future__ import annotations

import dataclasses
import datetime
import json
import time
from decimal import Decimal
from pathlib import Path

import pytest

from bootstrap_scripts.jobs.cli import dl_jobs
from bootstrap_scripts.jobs.controller import attempts
from bootstrap_scripts.jobs.controller.budget import JobBudget
from bootstrap_scripts.jobs.controller.instance_health import InstanceHealth
from bootstrap_scripts.jobs.controller.supervise import JobSupervisor
from bootstrap_scripts.jobs.engine import managed
from bootstrap_scripts.jobs.engine.classify import Failure, FailureClass, FailureKind
from bootstrap_scripts.jobs.engine.restart_policy import (
    Action,
    JobState,
    Policy,
    check_transition,
    decide,
)
from bootstrap_scripts.ops import cost
from bootstrap_scripts.ops.prices import PriceBook, list_filters
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.managed_records import (
    AttemptUsage,
    ManagedJob,
    ManagedRequest,
    NodeUsage,
)
from bootstrap_scripts.protocol.membership import Membership, Node
from bootstrap_scripts.protocol.paths import ClusterPaths
from bootstrap_scripts.protocol.records import InstancePrice
from bootstrap_scripts.protocol.run_request import RunRequest

# -- pure: how an instance was bought ------------------------------------------------------


@pytest.mark.parametrize("instance, market", [
    ({"InstanceId": "i-1"}, cost.Market.ON_DEMAND),
    ({"InstanceId": "i-1", "InstanceLifecycle": "spot"}, cost.Market.SPOT),
    ({"InstanceId": "i-1", "InstanceLifecycle": "capacity-block",
      "CapacityReservationId": "cr-1"}, cost.Market.CAPACITY_BLOCK),
    ({"InstanceId": "i-1", "CapacityReservationId": "cr-1"}, cost.Market.RESERVATION),
])
def test_the_market_comes_from_the_instances_lifecycle_and_reservation(instance, market):
    p = cost.purchase_of({**instance, "Placement": {"AvailabilityZone": "us-east-1b"}})
    assert (p.instance_id, p.market, p.zone) == ("i-1", market, "us-east-1b")


@pytest.mark.parametrize("market, option", [
    (cost.Market.ON_DEMAND, "OnDemand"), (cost.Market.RESERVATION, "OnDemand"),
    (cost.Market.CAPACITY_BLOCK, "CapacityBlock")])
def test_reservations_are_priced_on_demand_and_blocks_at_their_own_rate(market, option):
    filters = {f["Field"]: f["Value"] for f in list_filters("p5.48xlarge", "us-east-1", market)}
    assert filters["marketoption"] == option
    assert filters["instanceType"] == "p5.48xlarge" and filters["regionCode"] == "us-east-1"


# -- pure: the Price List and the Spot history ------------------------------------------------


def product(usd: str, unit: str = "Hrs") -> str:
    return json.dumps({"terms": {"OnDemand": {"T": {"priceDimensions": {
        "D": {"unit": unit, "pricePerUnit": {"USD": usd}}}}}}})


@pytest.mark.parametrize("price_list, expected", [
    ([product("1.0060000000")], Decimal("1.006")),
    ([product("0.0000000000"), product("0.526")], Decimal("0.526")),  # a zero rate: not it
    ([product("5", unit="Quantity")], None),
    (["not json", product("oops")], None),
    ([], None),
])
def test_the_hourly_rate_of_a_price_list(price_list, expected):
    assert cost.hourly_from_price_list(price_list) == expected


HISTORY = [{"Timestamp": 1000.0, "SpotPrice": "0.30"}, {"Timestamp": 2000.0, "SpotPrice": "0.40"},
           {"Timestamp": 3000.0, "SpotPrice": "0.50"}]


@pytest.mark.parametrize("at, expected", [
    (2500.0, Decimal("0.40")),  # the newest before
    (2000.0, Decimal("0.40")),  # exactly at a change
    (9999.0, Decimal("0.50")),
    (500.0, Decimal("0.30")),  # the history starts later: its oldest
])
def test_the_spot_price_in_effect(at, expected):
    assert cost.spot_price_at(HISTORY, at) == expected
    assert cost.spot_price_at(reversed(HISTORY), at) == expected


def test_no_spot_history_is_no_price():
    assert cost.spot_price_at([{"Timestamp": "x", "SpotPrice": "y"}], 1.0) is None


# -- pure: --max-cost ---------------------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [("12.5", Decimal("12.5")), (" 3 ", Decimal(3)),
                                            ("0.01", Decimal("0.01"))])
def test_a_cap_is_an_amount_in_usd(text, expected):
    assert cost.parse_usd(text) == expected


@pytest.mark.parametrize("text", ["0", "-5", "abc", "1.005", "NaN", "Infinity", "2000000", ""])
def test_a_bad_cap_is_refused_naming_its_value(text):
    with pytest.raises(ValueError, match="--max-cost") as err:
        cost.parse_usd(text)
    assert repr(text) in str(err.value)


# -- pure: the ledger -------------------------------------------------------------------------


def node(i: str, usd: str, market: str = "on-demand") -> NodeUsage:
    return NodeUsage(instance_id=i, instance_type="g5.xlarge", market=market, usd_per_hour=usd,
                     price_note="" if usd else "no answer")


def test_the_ledger_is_node_seconds_times_each_nodes_price():
    usages = (AttemptUsage(attempt=1, started_at=0.0, ended_at=1800.0,
                           nodes=(node("i-1", "1.006"), node("i-2", "0.40", "spot"))),
              AttemptUsage(attempt=2, started_at=2000.0, ended_at=None,
                           nodes=(node("i-1", "1.006"),)))
    ledger = cost.job_cost(usages, now=5600.0)
    # 0.5 h x (1.006 + 0.40) + 1 h x 1.006
    assert ledger.usd == Decimal("1.709")
    assert ledger.node_seconds == 1800 * 2 + 3600
    assert ledger.by_attempt == ((1, Decimal("0.703")), (2, Decimal("1.006")))
    assert cost.usd(ledger.usd) == "1.71"
    assert ledger.to_dict()["usd"] == "1.709"


def test_an_elastic_attempt_charges_a_joined_node_from_its_join_and_a_lost_one_to_its_loss():
    """(47.4) The nodes that ran, each for the time it ran: a node that joined the running
    attempt is charged from its join, a node lost while it trained on until the loss."""
    usages = (AttemptUsage(attempt=1, started_at=0.0, ended_at=3600.0, nodes=(
        node("i-1", "1.0"), dataclasses.replace(node("i-2", "1.0"), left_at=900.0),
        dataclasses.replace(node("i-3", "1.0"), joined_at=1800.0))),)
    ledger = cost.job_cost(usages, now=3600.0)
    assert ledger.node_seconds == 3600 + 900 + 1800
    assert ledger.usd == Decimal("1.75")


def test_the_budget_adds_a_joined_node_and_ends_a_lost_one_in_the_running_attempt():
    job = ManagedJob(job_id="j", state="running", attempt=1, usage=(AttemptUsage(
        attempt=1, started_at=0.0, nodes=(node("i-1", "1.0"), node("i-2", "1.0"))),))
    budget = JobBudget(ManagedRequest(job_id="j", submitted_at=0.0,
                                      run=RunRequest(job_id="j", command=("x",))), None)
    joined = Node(rank=2, role="worker", instance_id="i-3", address="10.0.0.3", gpus=0,
                  alias="worker-2", instance_type="g5.xlarge")
    job = dataclasses.replace(job, usage=budget.joined(job, [joined], at=1800.0))
    job = dataclasses.replace(job, usage=JobBudget.left(job, ["i-2"], at=900.0))
    (last,) = job.usage
    assert [(n.instance_id, n.joined_at, n.left_at) for n in last.nodes] == [
        ("i-1", None, None), ("i-2", None, 900.0), ("i-3", 1800.0, None)]
    assert budget.joined(job, [joined], at=2000.0) == job.usage  # already there
    ended = dataclasses.replace(job, usage=JobBudget.end(job, 1, at=3600.0))
    assert JobBudget.left(ended, ["i-1"], at=3700.0) == ended.usage  # an ended attempt: as is


def test_one_unknown_price_makes_the_total_unknown_and_says_why():
    usages = (AttemptUsage(attempt=1, started_at=0.0, ended_at=3600.0,
                           nodes=(node("i-1", "1.0"), node("i-2", ""))),)
    ledger = cost.job_cost(usages, now=3600.0)
    assert ledger.usd is None and ledger.by_attempt == ((1, None),)
    assert ledger.unknown == ("i-2 (g5.xlarge, on-demand): no answer",)
    assert cost.usd(ledger.usd) == "unknown"


@pytest.mark.parametrize("spent_hours, cap, verdict", [
    (0.5, "1.00", cost.CapVerdict.UNDER),
    (1.0, "1.00", cost.CapVerdict.REACHED),  # reaching the cap is enough
    (2.0, "1.00", cost.CapVerdict.REACHED),
    (2.0, None, cost.CapVerdict.UNDER),
])
def test_the_cap(spent_hours, cap, verdict):
    usages = (AttemptUsage(attempt=1, started_at=0.0, nodes=(node("i-1", "1.0"),)),)
    ledger = cost.job_cost(usages, now=spent_hours * 3600)
    assert cost.check_cap(ledger, Decimal(cap) if cap else None) is verdict


def test_a_cap_over_an_unknown_price_cannot_be_kept():
    usages = (AttemptUsage(attempt=1, started_at=0.0, nodes=(node("i-1", ""),)),)
    ledger = cost.job_cost(usages, now=1.0)
    assert cost.check_cap(ledger, Decimal(5)) is cost.CapVerdict.UNKNOWN
    assert "cannot be kept" in cost.cap_message(cost.CapVerdict.UNKNOWN, ledger, Decimal(5))


# -- pure: the budget outcome -------------------------------------------------------------------


def test_a_budget_stop_is_its_own_class_and_never_restarted():
    f = Failure(FailureKind.BUDGET, "stopped at the cost cap")
    assert f.failure_class is FailureClass.BUDGET
    d = decide(f, restarts=0, code_restarts=0, policy=Policy(max_restarts=5),
               cancel_requested=True)  # the budget wins over a cancel that came later
    assert (d.action, d.state, d.reason) == (Action.STOP_BUDGET, JobState.BUDGET,
                                            "stopped at the cost cap")
    assert JobState.BUDGET.terminal
    for old in (JobState.QUEUED, JobState.RUNNING, JobState.RESTARTING):
        assert check_transition(old, JobState.BUDGET) is JobState.BUDGET
    with pytest.raises(ValueError):
        check_transition(JobState.BUDGET, JobState.RUNNING)


# -- the price book (AWS faked) ------------------------------------------------------------------


class FakeAws:
    """EC2 and the Price List as boto3 clients answer, counting calls."""

    def __init__(self, instances: list[dict], *, spot: str = "0.3012", on_demand: str = "1.006",
                 fail: str = "") -> None:
        self.instances, self.spot, self.on_demand, self.fail = instances, spot, on_demand, fail
        self.calls: list[str] = []

    def __call__(self, service: str, region: str):
        return self

    def describe_instances(self, InstanceIds):
        self.calls.append("DescribeInstances")
        if self.fail:
            raise RuntimeError(self.fail)
        return {"Reservations": [{"Instances": [i for i in self.instances
                                                if i["InstanceId"] in InstanceIds]}]}

    def get_products(self, ServiceCode, MaxResults, Filters):
        self.calls.append("GetProducts")
        return {"PriceList": [product(self.on_demand)]}

    def describe_spot_price_history(self, **kwargs):
        self.calls.append("DescribeSpotPriceHistory")
        at = datetime.datetime.fromtimestamp(kwargs["EndTime"] - 60, tz=datetime.UTC)
        return {"SpotPriceHistory": [{"AvailabilityZone": kwargs["AvailabilityZone"],
                                      "SpotPrice": self.spot, "Timestamp": at}]}


NODES = [Node(rank=0, role="master", instance_id="i-m", address="127.0.0.1", alias="a",
              instance_type="g5.xlarge"),
         Node(rank=1, role="worker", instance_id="i-s", address="127.0.0.2", alias="b",
              instance_type="g5.xlarge")]
INSTANCES = [{"InstanceId": "i-m", "Placement": {"AvailabilityZone": "us-east-1a"}},
             {"InstanceId": "i-s", "InstanceLifecycle": "spot",
              "Placement": {"AvailabilityZone": "us-east-1b"}}]


def test_the_price_book_prices_each_market_once_and_caches_on_efs(tmp_path):
    aws = FakeAws(INSTANCES)
    book = PriceBook(tmp_path, "us-east-1", client=aws)
    usage = book.node_usage(NODES, time.time())
    assert [(n.market, n.zone, n.usd_per_hour) for n in usage] == [
        ("on-demand", "us-east-1a", "1.006"), ("spot", "us-east-1b", "0.3012")]
    assert sorted(aws.calls) == ["DescribeInstances", "DescribeSpotPriceHistory", "GetProducts"]
    cached = store.read_record(ClusterPaths(tmp_path).price("spot", "us-east-1b", "g5.xlarge"),
                               InstancePrice)
    assert cached.usd_per_hour == "0.3012" and "DescribeSpotPriceHistory" in cached.source
    # a new controller (a new book): the prices come from EFS, only the instances from EC2
    again = FakeAws(INSTANCES, spot="9", on_demand="9")
    assert PriceBook(tmp_path, "us-east-1", client=again).node_usage(NODES, time.time()) == usage
    assert again.calls == ["DescribeInstances"]


def test_a_price_aws_does_not_give_is_unknown_with_why_and_not_asked_again_at_once(tmp_path):
    aws = FakeAws(INSTANCES, fail="AccessDenied: ec2:DescribeInstances")
    book = PriceBook(tmp_path, "us-east-1", client=aws)
    usage = book.node_usage(NODES, time.time())
    assert all(not n.usd_per_hour and "AccessDenied" in n.price_note for n in usage)
    book.node_usage(NODES, time.time())
    assert aws.calls == ["DescribeInstances"]
    assert not (tmp_path / "cluster" / "prices").exists()
    nowhere = PriceBook(tmp_path, "", client=aws).node_usage(NODES[:1], time.time())
    assert "no AWS region" in nowhere[0].price_note and aws.calls == ["DescribeInstances"]


# -- the controller stops a job at its cap -----------------------------------------------------


class FixedBook:
    """A price book with one price for every node."""

    def __init__(self, usd: str) -> None:
        self.usd = usd

    def node_usage(self, nodes, at):
        return tuple(node(n.instance_id, self.usd) for n in nodes)


def supervisor(efs: Path, max_cost: str, prices) -> JobSupervisor:
    (efs / "managed").mkdir(exist_ok=True)
    req = ManagedRequest(job_id="capped-1", submitted_at=time.time(), max_cost_usd=max_cost,
                         run=RunRequest(job_id="capped-1", command=("true",)))
    paths = managed.submit(efs, req)
    job = ManagedJob(job_id="capped-1", state=JobState.QUEUED.value,
                     max_cost_usd=max_cost)
    return JobSupervisor(root=efs / "node", efs=efs, paths=paths, request=req, job=job,
                         health=InstanceHealth(""), gate=None, tick=lambda: None,
                         stopping=lambda: False, prices=prices)


def test_the_controller_stops_a_running_attempt_at_the_cap_like_a_cancel(tmp_path):
    sup = supervisor(tmp_path, "1.00", FixedBook("3600"))  # a dollar a second
    usage = sup.budget.start(sup.job, 1, NODES[:1], at=time.time() - 0.5)
    sup.update(state=JobState.RUNNING.value, attempt=1, usage=usage)
    jpaths = ClusterPaths(tmp_path).job("capped-1.1")
    jpaths.dir.mkdir(parents=True)
    deadline = time.monotonic() + 10
    # the attempt "runs" until its cancel file appears (what the executors act on)
    sup.follow(jpaths, lambda: not store.exists(jpaths.cancel) and time.monotonic() < deadline)
    assert store.exists(jpaths.cancel), "the cap never stopped the attempt"
    assert "cost cap" in store.read_text(jpaths.cancel)
    sup.update(usage=JobBudget.end(sup.job, 1))
    # the stopped attempt ends cancelled (the SIGTERM): the job ends budget, not restarted
    sup.after_attempt(None, Failure(FailureKind.CANCELLED, "the attempt was cancelled"),
                      time.time())
    rec = managed.load_job(sup.paths)
    assert rec.state == "budget" and rec.restarts == 0, rec
    assert "--max-cost 1.00 USD" in rec.message
    assert cost.job_cost(rec.usage, time.time()).usd >= Decimal(1)


def test_an_attempt_under_its_cap_is_not_stopped(tmp_path):
    sup = supervisor(tmp_path, "100", FixedBook("1.0"))
    sup.update(state=JobState.RUNNING.value, attempt=1,
               usage=sup.budget.start(sup.job, 1, NODES, at=time.time()))
    jpaths = ClusterPaths(tmp_path).job("capped-1.1")
    jpaths.dir.mkdir(parents=True)
    polls = iter(range(3))
    sup.follow(jpaths, lambda: next(polls, None) is not None)
    assert not store.exists(jpaths.cancel) and not sup.budget.stopped


def test_a_capped_job_whose_nodes_cannot_be_priced_does_not_start(tmp_path, monkeypatch):
    sup = supervisor(tmp_path, "5", PriceBook(tmp_path, ""))  # no region: no price
    monkeypatch.setattr(attempts, "spawn", lambda *a, **k: pytest.fail("the attempt started"))
    m = Membership(cluster_id="c", generation=1, nodes=tuple(NODES), efs_mount=str(tmp_path))
    failure, _at = sup.run_attempt(m, list(NODES))
    assert failure.kind is FailureKind.BUDGET and "cannot be kept" in failure.detail
    sup.after_attempt(m, failure, time.time())
    rec = managed.load_job(sup.paths)
    assert rec.state == "budget" and "no AWS region" in rec.message


def test_a_bad_cap_in_a_request_fails_the_job_naming_it(tmp_path):
    sup = supervisor(tmp_path, "lots", FixedBook("1"))
    rec = sup.run()
    assert rec.state == "failed" and "'lots'" in rec.message and "--max-cost" in rec.message


# -- dl-jobs shows the ledger ------------------------------------------------------------------


def test_dl_jobs_lists_and_shows_the_cost(tmp_path, capsys):
    sup = supervisor(tmp_path, "50", FixedBook("2.5"))
    now = time.time()
    sup.update(state=JobState.RUNNING.value, attempt=1,
               usage=(AttemptUsage(attempt=1, started_at=now - 7200, ended_at=now - 3600,
                                   nodes=(node("i-m", "2.5"), node("i-s", "0.5", "spot"))),))
    args = ["--mount-point", str(tmp_path)]
    assert dl_jobs.main([*args, "--json"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)["jobs"]
    assert listed["cost"]["usd"] == "3" and listed["max_cost_usd"] == "50"
    assert dl_jobs.main(args) == 0
    table = capsys.readouterr().out
    assert "COST USD" in table and "3.00/50" in table
    assert dl_jobs.main([*args, "show", "capped-1"]) == 0
    shown = capsys.readouterr().out
    assert "cost:         3.00 USD (2.000 node-hours) of --max-cost 50 USD" in shown
    assert "attempt 1:" in shown and "i-s g5.xlarge spot 0.5/h" in shown


# -- dl-run --max-cost ----------------------------------------------------------------------


def test_dl_run_carries_max_cost_exactly_and_refuses_a_bad_one_naming_it(capsys):
    import argparse

    from bootstrap_scripts.jobs.cli import dl_run
    from bootstrap_scripts.jobs.cli.request_args import max_cost_from_args
    from bootstrap_scripts.jobs.engine.outcomes import RunError

    assert max_cost_from_args(argparse.Namespace(max_cost="12.50")) == "12.5"
    assert max_cost_from_args(argparse.Namespace(max_cost=None)) == ""
    with pytest.raises(RunError, match=r"--max-cost .*'1e9'") as err:
        max_cost_from_args(argparse.Namespace(max_cost="1e9"))
    assert err.value.code == 2
    # the controller keeps the cap: a run without it cannot promise one
    assert dl_run.main(["--unmanaged", "--max-cost", "5", "--", "true"]) == 2
    assert "--max-cost only apply to managed jobs" in capsys.readouterr().err
