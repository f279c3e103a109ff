"""CloudWatch's alarm evaluation and Auto Scaling's group metrics, which moto does not play.

moto stores alarms (``emulator.moto_alarms`` creates the stack's) and metric data, but never
evaluates an alarm, never changes its state and never runs its actions; nor does its Auto
Scaling publish the group metrics a group collects. :class:`CloudWatchActs` plays both, one
:meth:`~CloudWatchActs.tick` at a time, through moto's own APIs only:

1. **Group metrics.** A group with metrics collection enabled (``EnabledMetrics``;
   ``emulator.moto_cloudformation`` applies the template's ``MetricsCollection``) gets its
   ``AWS/AutoScaling`` metrics (desired, in service, pending, terminating, standby, total,
   min, max) under ``AutoScalingGroupName`` once a minute, as Auto Scaling publishes them at
   1-minute granularity
   (https://docs.aws.amazon.com/autoscaling/ec2/userguide/ec2-auto-scaling-metrics.html).
2. **Alarms.** Once a minute every metric alarm is evaluated as CloudWatch does
   (https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/AlarmThatSendsEmail.html):
   its last ``EvaluationPeriods`` periods (the current, partial one included) are read with
   GetMetricData (math expressions by ``emulator.metric_math``); ``DatapointsToAlarm`` (by
   default all of them) breaching the threshold mean ``ALARM``; missing points count as
   ``TreatMissingData`` says (``missing``: none at all is ``INSUFFICIENT_DATA``; ``ignore``:
   the state stays). A changed state is set with SetAlarmState, with a reason in
   CloudWatch's words, and the new state's actions that are SNS topics get CloudWatch's
   alarm notification (Publish; its JSON fields as CloudWatch sends them).

The publish is CloudWatch's, as the service principal ``cloudwatch.amazonaws.com``: it is
made only if the topic's policy (and, for an encrypted topic, its key's policy) lets that
principal publish for this alarm (``aws:SourceAccount``, ``aws:SourceArn``), as
``emulator.service_policies`` decides; a refused one is not published and is kept in
``refused`` and said, as CloudWatch records a failed action in the alarm's history.

Differences from AWS (docs/emulator.md): the evaluation reads moto's data as it is when the
tick runs (CloudWatch waits a little for late points); only SNS actions are run; the
publish itself, once the policies allow it, is sent with the emulator's own credentials.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from botocore.exceptions import ClientError

from emulator import metric_math, service_policies

#: Who publishes an alarm's notification: CloudWatch's service principal.
SERVICE = "cloudwatch.amazonaws.com"
#: Auto Scaling publishes group metrics, and CloudWatch evaluates 1-minute alarms, each minute.
MINUTE = 60.0
GROUP_METRICS = {
    "GroupMinSize": lambda g: g["MinSize"], "GroupMaxSize": lambda g: g["MaxSize"],
    "GroupDesiredCapacity": lambda g: g["DesiredCapacity"],
    "GroupInServiceInstances": lambda g: _count(g, "InService"),
    "GroupPendingInstances": lambda g: _count(g, "Pending"),
    "GroupStandbyInstances": lambda g: _count(g, "Standby"),
    "GroupTerminatingInstances": lambda g: _count(g, "Terminating"),
    "GroupTotalInstances": lambda g: len(g.get("Instances", [])),
}
_OPERATORS: dict[str, Callable[[float, float], bool]] = {
    "GreaterThanOrEqualToThreshold": lambda v, t: v >= t,
    "GreaterThanThreshold": lambda v, t: v > t,
    "LessThanThreshold": lambda v, t: v < t,
    "LessThanOrEqualToThreshold": lambda v, t: v <= t,
}
_WORDS = {"GreaterThanOrEqualToThreshold": "greater than or equal to",
          "GreaterThanThreshold": "greater than", "LessThanThreshold": "less than",
          "LessThanOrEqualToThreshold": "less than or equal to"}
_REGIONS = {"us-east-1": "US East (N. Virginia)", "us-east-2": "US East (Ohio)",
            "us-west-2": "US West (Oregon)", "eu-west-1": "EU (Ireland)"}


def _count(group: Mapping[str, Any], state: str) -> int:
    return sum(1 for i in group.get("Instances", [])
               if str(i.get("LifecycleState", "")).startswith(state))


def group_metric_data(group: Mapping[str, Any], stamp: datetime) -> list[dict]:
    """PutMetricData entries for the group's enabled metrics (none when collection is off)."""
    enabled = {m["Metric"] for m in group.get("EnabledMetrics", [])}
    dims = [{"Name": "AutoScalingGroupName", "Value": group["AutoScalingGroupName"]}]
    return [{"MetricName": name, "Dimensions": dims, "Timestamp": stamp,
             "Value": float(value(group)), "Unit": "None"}
            for name, value in GROUP_METRICS.items() if name in enabled]


def _queries(alarm: Mapping[str, Any]) -> list[dict]:
    """The alarm as MetricDataQuery entries (a single-metric alarm as one query ``m``)."""
    if alarm.get("Metrics"):
        return [dict(q) for q in alarm["Metrics"]]
    stat = alarm.get("ExtendedStatistic") or alarm["Statistic"]
    return [{"Id": "m", "ReturnData": True, "MetricStat": {
        "Metric": {"Namespace": alarm["Namespace"], "MetricName": alarm["MetricName"],
                   "Dimensions": alarm.get("Dimensions", [])},
        "Period": alarm["Period"], "Stat": stat}}]


def _period(alarm: Mapping[str, Any], queries: list[dict]) -> int:
    if alarm.get("Period"):
        return int(alarm["Period"])
    return max(int(q.get("Period") or q.get("MetricStat", {}).get("Period", 60))
               for q in queries)


def window(alarm: Mapping[str, Any], now: datetime) -> tuple[datetime, datetime, int]:
    """(start, end, period) of the periods an evaluation at ``now`` reads: the last
    ``EvaluationPeriods`` periods, aligned to the period, the current one included."""
    period = _period(alarm, _queries(alarm))
    end_s = (math.floor(now.timestamp() / period) + 1) * period
    start_s = end_s - int(alarm["EvaluationPeriods"]) * period
    return (datetime.fromtimestamp(start_s, tz=UTC), datetime.fromtimestamp(end_s, tz=UTC),
            period)


def series(cloudwatch, alarm: Mapping[str, Any], now: datetime) -> dict[datetime, float]:
    """The alarm's evaluated series over its window: the query returning data."""
    queries = _queries(alarm)
    start, end, _ = window(alarm, now)
    stats = [q for q in queries if "MetricStat" in q]
    data: dict[str, dict[datetime, float]] = {q["Id"]: {} for q in stats}
    if stats:
        res = cloudwatch.get_metric_data(
            MetricDataQueries=[{"Id": q["Id"], "MetricStat": q["MetricStat"],
                                "ReturnData": True} for q in stats],
            StartTime=start, EndTime=end, ScanBy="TimestampAscending")
        for result in res["MetricDataResults"]:
            data[result["Id"]] = {t.astimezone(UTC): v for t, v in
                                  zip(result["Timestamps"], result["Values"], strict=True)}
    (out,) = [q for q in queries if q.get("ReturnData", True)]
    if "Expression" in out:
        return metric_math.evaluate(out["Expression"], data)
    return data[out["Id"]]


def decide(alarm: Mapping[str, Any], points: Mapping[datetime, float],
           now: datetime) -> tuple[str, str, list[tuple[datetime, float]]]:
    """(state, reason, the points read) for the alarm's last periods: CloudWatch's rule."""
    start, _, period = window(alarm, now)
    periods = int(alarm["EvaluationPeriods"])
    needed = int(alarm.get("DatapointsToAlarm") or periods)
    threshold = float(alarm["Threshold"])
    breaches = _OPERATORS[alarm["ComparisonOperator"]]
    treat = alarm.get("TreatMissingData", "missing")
    buckets = [start + timedelta(seconds=i * period) for i in range(periods)]
    read = [(b, points[b]) for b in buckets if b in points]
    bad = sum(1 for _, v in read if breaches(v, threshold))
    if treat == "breaching":
        bad += periods - len(read)
    words = _WORDS[alarm["ComparisonOperator"]]
    shown = ", ".join(f"{v:g} ({b:%d/%m/%y %H:%M:%S})" for b, v in read)
    if bad >= needed:
        return "ALARM", (f"Threshold Crossed: {bad} out of the last {periods} datapoints "
                         f"[{shown}] were {words} the threshold ({threshold:g}) (minimum "
                         f"{needed} datapoints for OK -> ALARM transition)."), read
    if not read and treat == "missing":
        return "INSUFFICIENT_DATA", (f"Insufficient Data: {periods} datapoints were unknown."
                                     ), read
    if not read and treat == "ignore":
        return alarm["StateValue"], alarm.get("StateReason", ""), read
    return "OK", (f"Threshold Crossed: {len(read)} datapoint(s) [{shown}] not {words} the "
                  f"threshold ({threshold:g}); missing data treated as {treat}."), read


def notification(alarm: Mapping[str, Any], old: str, new: str, reason: str,
                 region: str, changed: datetime) -> tuple[str, str]:
    """(subject, message) of CloudWatch's SNS notification of a state change."""
    account = str(alarm["AlarmArn"]).split(":")[4]
    trigger: dict[str, Any] = {
        "EvaluationPeriods": alarm["EvaluationPeriods"], "Threshold": alarm["Threshold"],
        "ComparisonOperator": alarm["ComparisonOperator"],
        "TreatMissingData": alarm.get("TreatMissingData", "missing")}
    if alarm.get("Metrics"):
        trigger["Metrics"] = alarm["Metrics"]
    else:
        trigger.update(MetricName=alarm["MetricName"], Namespace=alarm["Namespace"],
                       Statistic=str(alarm.get("Statistic", "")).upper(),
                       Period=alarm["Period"],
                       Dimensions=[{"name": d["Name"], "value": d["Value"]}
                                   for d in alarm.get("Dimensions", [])])
    message = {
        "AlarmName": alarm["AlarmName"], "AlarmDescription": alarm.get("AlarmDescription"),
        "AWSAccountId": account, "AlarmConfigurationUpdatedTimestamp":
            _iso(alarm.get("AlarmConfigurationUpdatedTimestamp", changed)),
        "NewStateValue": new, "NewStateReason": reason, "StateChangeTime": _iso(changed),
        "Region": _REGIONS.get(region, region), "AlarmArn": alarm["AlarmArn"],
        "OldStateValue": old, "OKActions": alarm.get("OKActions", []),
        "AlarmActions": alarm.get("AlarmActions", []),
        "InsufficientDataActions": alarm.get("InsufficientDataActions", []),
        "Trigger": trigger}
    subject = f'{new}: "{alarm["AlarmName"]}" in {_REGIONS.get(region, region)}'
    return subject[:100], json.dumps(message, default=str)


def _iso(stamp: object) -> str:
    if isinstance(stamp, datetime):
        return stamp.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "+0000"
    return str(stamp)


class CloudWatchActs:
    """Group metrics and alarm evaluation, at most once a minute each (module docstring).

    ``say``: one line per alarm state change, for the console."""

    def __init__(self, session, *, say: Callable[[str], None] = lambda _line: None,
                 every: float = MINUTE) -> None:
        self.cloudwatch = session.client("cloudwatch")
        self.asg = session.client("autoscaling")
        self.sns = session.client("sns")
        self.kms = session.client("kms")
        self.region = session.region_name
        self.say = say
        self.every = every
        self.last = float("-inf")
        #: (alarm name, old state, new state, reason) of every change, in order
        self.changes: list[tuple[str, str, str, str]] = []
        self.problems: list[str] = []  # alarms the evaluator could not play, said once
        #: (alarm name, topic ARN, why) of every action the topic's or key's policy refused
        self.refused: list[tuple[str, str, str]] = []
        self._running: threading.Thread | None = None

    def tick(self, now: datetime | None = None, *, force: bool = False,
             background: bool = False) -> None:
        """One round when one is due (``force``: now). ``background``: in a thread of its
        own, so a slow GetMetricData never delays the caller (CloudWatch does not wait for
        Auto Scaling, nor it for CloudWatch); a round still running skips this one."""
        when = now or datetime.now(UTC)
        if not force and when.timestamp() - self.last < self.every:
            return
        if self._running is not None and self._running.is_alive():
            return
        self.last = when.timestamp()
        if background:
            self._running = threading.Thread(target=self._round, args=(when,), daemon=True,
                                             name="cloudwatch-round")
            self._running.start()
        else:
            self._round(when)

    def _round(self, when: datetime) -> None:
        try:
            self.publish_group_metrics(when)
            self.evaluate(when)
        except (ClientError, OSError) as exc:  # AWS acting on its own never fails a caller
            self.say(f"CloudWatch's own round failed: {exc}")

    def publish_group_metrics(self, now: datetime) -> int:
        data = [d for g in self.asg.describe_auto_scaling_groups()["AutoScalingGroups"]
                for d in group_metric_data(g, now)]
        for i in range(0, len(data), 500):
            self.cloudwatch.put_metric_data(Namespace="AWS/AutoScaling",
                                            MetricData=data[i:i + 500])
        return len(data)

    def evaluate(self, now: datetime) -> None:
        pages = self.cloudwatch.get_paginator("describe_alarms").paginate(
            AlarmTypes=["MetricAlarm"])
        for alarm in (a for page in pages for a in page["MetricAlarms"]):
            try:
                points = series(self.cloudwatch, alarm, now)
            except metric_math.UnsupportedExpression as exc:
                if alarm["AlarmName"] not in self.problems:
                    self.problems.append(alarm["AlarmName"])
                    self.say(f"alarm {alarm['AlarmName']} is not evaluated: {exc}")
                continue
            state, reason, read = decide(alarm, points, now)
            old = alarm["StateValue"]
            if state == old:
                continue
            self.cloudwatch.set_alarm_state(
                AlarmName=alarm["AlarmName"], StateValue=state, StateReason=reason[:1023],
                StateReasonData=json.dumps({"version": "1.0", "queryDate": _iso(now),
                                            "recentDatapoints": [v for _, v in read],
                                            "threshold": alarm["Threshold"]}))
            self.changes.append((alarm["AlarmName"], old, state, reason))
            self.say(f"alarm {alarm['AlarmName']}: {old} -> {state}")
            if alarm.get("ActionsEnabled", True):
                self.act(alarm, old, state, reason, now)

    def act(self, alarm: Mapping[str, Any], old: str, new: str, reason: str,
            now: datetime) -> None:
        key = {"ALARM": "AlarmActions", "OK": "OKActions",
               "INSUFFICIENT_DATA": "InsufficientDataActions"}[new]
        subject, message = notification(alarm, old, new, reason, self.region, now)
        for arn in alarm.get(key, []):
            if not arn.startswith("arn:aws:sns:"):
                continue
            why = self.refusal(alarm, arn)
            if why:
                self.refused.append((alarm["AlarmName"], arn, why))
                self.say(f"alarm {alarm['AlarmName']}: failed to execute action {arn}: "
                         f"CloudWatch is not authorized to perform SNS:Publish ({why})")
                continue
            self.sns.publish(TopicArn=arn, Subject=subject, Message=message)

    def refusal(self, alarm: Mapping[str, Any], topic_arn: str) -> str:
        """Why SNS would refuse CloudWatch's publish of ``alarm`` to the topic ("" if not)."""
        account = topic_arn.split(":")[4]
        context = {"aws:SourceAccount": account, "aws:SourceOwner": account,
                   "aws:SourceArn": str(alarm.get("AlarmArn", "")),
                   "aws:SecureTransport": "true"}
        try:
            attributes = self.sns.get_topic_attributes(TopicArn=topic_arn)["Attributes"]
        except ClientError as exc:
            return f"topic: {exc}"
        why = service_policies.decide(attributes.get("Policy", "{}"), service=SERVICE,
                                      action="sns:Publish", resource=topic_arn,
                                      context=context)
        if why or not attributes.get("KmsMasterKeyId"):
            return f"topic policy: {why}" if why else ""
        try:
            key = self.kms.get_key_policy(KeyId=attributes["KmsMasterKeyId"],
                                          PolicyName="default")["Policy"]
        except ClientError as exc:
            return f"key: {exc}"
        why = service_policies.decide(key, service=SERVICE, action="kms:GenerateDataKey",
                                      resource="*", context=context)
        return f"key policy: {why}" if why else ""
