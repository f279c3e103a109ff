"""``AWS::CloudWatch::Alarm`` for moto's CloudFormation (part of ``emulator.moto_cloudformation``).

moto 5.2's CloudFormation has ``AWS::CloudWatch::Dashboard`` but no alarm: it skips the type
with a warning, and a template whose dashboard shows an alarm (``Fn::GetAtt [Alarm, Arn]``)
then fails to deploy ("references undefined resource"). CloudFormation creates the alarm
with PutMetricAlarm's fields and returns its ``Arn``
(https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/aws-resource-cloudwatch-alarm.html);
the emulator does the same through moto's own CloudWatch backend, so DescribeAlarms lists
the stack's alarms (metric alarms and metric-math alarms with their queries) as on AWS,
each in ``INSUFFICIENT_DATA`` until first evaluated (moto would start it ``OK``).
``emulator.alarm_evaluator`` evaluates them (docs/emulator.md).
"""

from __future__ import annotations

import contextlib
from typing import Any

from emulator.cfn_model import cfn_model


def _queries(metrics: list[dict[str, Any]] | None) -> list[Any] | None:
    """The template's ``Metrics`` (MetricDataQuery properties) as moto's query objects."""
    if not metrics:
        return None
    from moto.cloudwatch.models import Dimension, Metric, MetricDataQuery, MetricStat

    out = []
    for q in metrics:
        stat = None
        if "MetricStat" in q:
            s = q["MetricStat"]
            m = s["Metric"]
            stat = MetricStat(Metric(m.get("MetricName", ""), m.get("Namespace", ""),
                                     [Dimension(d["Name"], d["Value"])
                                      for d in m.get("Dimensions", [])]),
                              s.get("Period"), s.get("Stat", ""), s.get("Unit"))
        out.append(MetricDataQuery(q["Id"], q.get("Label", ""), q.get("Period"),
                                   str(q.get("ReturnData", True)).lower() == "true",
                                   expression=q.get("Expression"), metric_stat=stat))
    return out


def alarm_model() -> type:
    """The model class; defining it registers it (moto lists CloudFormationModel's
    subclasses by their ``cloudformation_type``)."""
    from moto.cloudwatch.models import cloudwatch_backends

    def create(resource_name: str, p: dict[str, Any], account_id: str,
               region: str) -> tuple[str, dict[str, str]]:
        name = p.get("AlarmName") or resource_name
        alarm = cloudwatch_backends[account_id][region].put_metric_alarm(
            name=name, namespace=p.get("Namespace", ""),
            metric_name=p.get("MetricName", ""),
            comparison_operator=p["ComparisonOperator"],
            evaluation_periods=int(p["EvaluationPeriods"]),
            period=int(p.get("Period", 0) or 0), threshold=float(p.get("Threshold", 0)),
            statistic=p.get("Statistic", ""), description=p.get("AlarmDescription", ""),
            dimensions=[{"Name": d["Name"], "Value": d["Value"]}
                        for d in p.get("Dimensions", [])],
            alarm_actions=list(p.get("AlarmActions", [])),
            metric_data_queries=_queries(p.get("Metrics")),
            datapoints_to_alarm=p.get("DatapointsToAlarm"),
            ok_actions=list(p.get("OKActions", [])),
            insufficient_data_actions=list(p.get("InsufficientDataActions", [])),
            actions_enabled=bool(p.get("ActionsEnabled", True)),
            treat_missing_data=p.get("TreatMissingData"))
        # a new alarm starts INSUFFICIENT_DATA on AWS (moto's starts OK) until evaluated
        cloudwatch_backends[account_id][region].set_alarm_state(
            name, "Unchecked: Initial alarm creation", None, "INSUFFICIENT_DATA")
        return name, {"Arn": alarm.alarm_arn}

    def delete(resource_name: str, p: dict[str, Any], account_id: str, region: str) -> None:
        with contextlib.suppress(Exception):  # already gone: nothing to delete
            cloudwatch_backends[account_id][region].delete_alarms([resource_name])

    return cfn_model("AWS::CloudWatch::Alarm", name_type="AlarmName", attributes=("Arn",),
                     create=create, delete=delete)
