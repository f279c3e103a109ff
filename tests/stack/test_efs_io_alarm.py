"""The EFS I/O alarm (constructs_lib/observability.py): the shared file system's metered I/O
in an hour, against ``efsIoAlarmGiBPerHour``, on the cluster's alarm topic like every other
alarm of the stack; ``0`` leaves it out, a value out of bounds is refused at synth."""

from __future__ import annotations

import pytest
from aws_cdk.assertions import Template

from constructs_lib.cluster_settings import ClusterSettings
from constructs_lib.observability import DEFAULT_EFS_IO_ALARM_GIB_PER_HOUR, GIB
from constructs_lib.validation import ConfigError
from stacks.settings import settings_from_context
from tests.stack.synth import cluster_template


def efs_alarms(t: Template) -> list[dict]:
    return [a["Properties"] for a in t.find_resources("AWS::CloudWatch::Alarm").values()
            if a["Properties"].get("MetricName") == "MeteredIOBytes"]


def the_file_system(t: Template) -> str:
    (fs,) = t.find_resources("AWS::EFS::FileSystem")
    return fs


def test_the_default_alarms_on_50_gib_of_metered_io_in_an_hour_to_the_alarm_topic() -> None:
    t = cluster_template()
    (alarm,) = efs_alarms(t)
    assert DEFAULT_EFS_IO_ALARM_GIB_PER_HOUR == 50
    assert (alarm["Namespace"], alarm["Statistic"], alarm["Period"]) == ("AWS/EFS", "Sum", 3600)
    assert alarm["Dimensions"] == [{"Name": "FileSystemId",
                                    "Value": {"Ref": the_file_system(t)}}]
    assert alarm["Threshold"] == 50 * GIB and alarm["EvaluationPeriods"] == 1
    assert alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
    assert alarm["TreatMissingData"] == "notBreaching"
    # the same topic as the stack's other alarms (whose policy lets CloudWatch publish)
    others = [a["Properties"]["AlarmActions"]
              for a in t.find_resources("AWS::CloudWatch::Alarm").values()
              if a["Properties"].get("MetricName") != "MeteredIOBytes"]
    assert others and all(actions == alarm["AlarmActions"] for actions in others)
    (topic,) = [k for k, v in t.find_resources("AWS::SNS::Topic").items()
                if "AlarmTopic" in k]
    assert alarm["AlarmActions"] == [{"Ref": topic}]
    assert "efsIoAlarmGiBPerHour" in alarm["AlarmDescription"]


def test_the_threshold_is_the_setting_and_an_existing_file_system_is_named() -> None:
    t = cluster_template(efsIoAlarmGiBPerHour="200", efsFileSystemId="fs-0123456789abcdef0",
                         vpcId="vpc-0123456789abcdef0",
                         vpcPrivateSubnetIds="subnet-0123456789abcdef0,subnet-0123456789abcdef1",
                         availabilityZones="us-east-1a,us-east-1b")
    (alarm,) = efs_alarms(t)
    assert alarm["Threshold"] == 200 * GIB
    assert alarm["Dimensions"] == [{"Name": "FileSystemId", "Value": "fs-0123456789abcdef0"}]


def test_zero_means_no_alarm() -> None:
    assert efs_alarms(cluster_template(efsIoAlarmGiBPerHour="0")) == []


@pytest.mark.parametrize("value", ["-1", "1.5", "lots", "1000001"])
def test_a_threshold_out_of_bounds_is_refused_naming_the_key(value: str) -> None:
    with pytest.raises(ConfigError, match="efsIoAlarmGiBPerHour"):
        settings_from_context({"efsIoAlarmGiBPerHour": value}.get)


def test_the_default_lives_in_the_settings() -> None:
    assert ClusterSettings().efs_io_alarm_gib_per_hour == DEFAULT_EFS_IO_ALARM_GIB_PER_HOUR
