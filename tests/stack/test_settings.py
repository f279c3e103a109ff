"""Context keys: defaults, parsing, and errors that name the key and the bad value."""

from __future__ import annotations

import pytest

from constructs_lib.validation import ConfigError
from stacks.cluster_stack import ClusterSettings
from stacks.settings import CONTEXT_KEYS, settings_from_context


def settings(**ctx: object) -> ClusterSettings:
    return settings_from_context(ctx.get)


def test_defaults() -> None:
    s = settings()
    assert s == ClusterSettings()
    assert (s.worker_count, s.image_type, s.efs_mount_point, s.root_volume_gib) == (
        2,
        "amazon-linux-2023",
        "/efs",
        100,
    )
    assert s.ssh_cidr is None and s.key_name is None and s.placement_group is False


def test_every_documented_key_is_parsed() -> None:
    ctx = {
        "workerCount": "3",
        "workerInstanceType": "p4d.24xlarge",
        "masterInstanceType": "g5.2xlarge",
        "imageType": "ubuntu",
        "pytorchVersion": "2.11",
        "amiId": "ami-0123456789abcdef0",
        "sshCidr": "203.0.113.0/24",
        "keyName": "me",
        "efsFileSystemId": "fs-0123abcd",
        "efsMountPoint": "/shared",
        "vpcCidr": "10.1.0.0/16",
        "rootVolumeGiB": "500",
        "placementGroup": "true",
        "maxWorkers": "8",
        "spotWorkers": "2",
        "dataPrepScript": "/efs/prep.sh --fast",
    }
    assert set(ctx) == set(CONTEXT_KEYS)
    s = settings(**ctx)
    assert s == ClusterSettings(
        worker_count=3,
        worker_instance_type="p4d.24xlarge",
        master_instance_type="g5.2xlarge",
        image_type="ubuntu",
        pytorch_version="2.11",
        ami_id="ami-0123456789abcdef0",
        ssh_cidr="203.0.113.0/24",
        key_name="me",
        efs_file_system_id="fs-0123abcd",
        efs_mount_point="/shared",
        vpc_cidr="10.1.0.0/16",
        root_volume_gib=500,
        placement_group=True,
        max_workers=8,
        spot_workers=2,
        data_prep_script="/efs/prep.sh --fast",
    )


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("workerCount", "0"),
        ("workerCount", "two"),
        ("workerCount", "-1"),
        ("workerCount", "1.5"),
        ("rootVolumeGiB", "49"),
        ("rootVolumeGiB", "big"),
        ("vpcCidr", "10.0.0.0/33"),
        ("vpcCidr", "10.0.0.1/16"),
        ("vpcCidr", "not-a-cidr"),
        ("vpcCidr", "10.0.0.0/8"),
        ("sshCidr", "0.0.0.0/0"),
        ("sshCidr", "1.2.3"),
        ("efsFileSystemId", "fs-XYZ"),
        ("efsFileSystemId", "12345"),
        ("imageType", "windows"),
        ("pytorchVersion", "2"),
        ("pytorchVersion", "2.13.0"),
        ("pytorchVersion", "latest"),
        ("pytorchVersion", "v2.13"),
        ("pytorchVersion", "2.x"),
        ("amiId", "ami-nothex!"),
        ("efsMountPoint", "relative/path"),
        ("efsMountPoint", "/"),
        ("workerInstanceType", "g5"),
        ("placementGroup", "maybe"),
        ("maxWorkers", "0"),
        ("maxWorkers", "many"),
        ("spotWorkers", "-1"),
        ("dataPrepScript", "line one\nline two"),
        ("dataPrepScript", "  "),
    ],
)
def test_bad_values_name_key_and_value(key: str, value: str) -> None:
    with pytest.raises(ConfigError) as err:
        settings(**{key: value})
    message = str(err.value)
    assert key in message and repr(value) in message, message


def test_numbers_from_cdk_json_are_accepted() -> None:
    assert settings(workerCount=4, placementGroup=False).worker_count == 4


def test_elastic_defaults_and_max_below_the_deployed_count() -> None:
    s = settings()
    assert (s.max_workers, s.spot_workers, s.data_prep_script) == (None, 0, None)
    with pytest.raises(ConfigError) as err:
        settings(workerCount="3", spotWorkers="2", maxWorkers="4")
    assert "'maxWorkers' must be at least workerCount + spotWorkers (5), got 4" in str(err.value)


def test_context_errors_name_the_key_not_a_construct() -> None:
    """app.py prints this after "error: " (README "Settings")."""
    with pytest.raises(ConfigError) as err:
        settings(workerCount="0")
    assert str(err.value) == "context key 'workerCount' must be an integer >= 1, got '0'"


def test_defaults_are_the_constructs_own() -> None:
    """ClusterSettings restates no default: an unset key means the construct's default."""
    import inspect

    from constructs_lib import DeepLearningCluster

    props = inspect.signature(DeepLearningCluster.__init__).parameters
    s = ClusterSettings()
    for field in ("worker_count", "worker_instance_type", "master_instance_type", "image_type",
                  "pytorch_version",
                  "efs_mount_point", "vpc_cidr", "root_volume_gib", "spot_workers",
                  "max_workers", "ssh_cidr", "data_prep_script"):
        assert getattr(s, field) == props[field].default, field
    assert s.placement_group is props["create_placement_group"].default
