"""Context keys: defaults, parsing, and errors that name the key and the bad value."""

from __future__ import annotations

import pytest

from constructs_lib.validation import ConfigError
from stacks.cluster_stack import ClusterSettings
from stacks.settings import CAPACITY_CONTEXT_KEYS, CONTEXT_KEYS, settings_from_context
from tests.stack.synth import cluster_template


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
    assert s.ssh_cidr is None and s.key_name is None and s.nat_gateways == 1
    # unset: a new placement group unless a reservation or block fixes the zone
    # (constructs_lib/cluster_props.wants_new_placement_group; tests/stack/test_one_zone.py)
    assert s.placement_group is None


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
        "vpcId": "vpc-0123456789abcdef0",
        "vpcPrivateSubnetIds": "subnet-0123456789abcdef0,subnet-0123456789abcdef1",
        "vpcPublicSubnetIds": "subnet-0123456789abcdef2,subnet-0123456789abcdef3",
        "availabilityZones": "us-east-1a,us-east-1b",
        "rootVolumeGiB": "500",
        "placementGroup": "true",
        "maxWorkers": "8",
        "spotWorkers": "2",
        "dataPrepScript": "/efs/prep.sh --fast",
        "sshAllowWideCidr": "false",
        "maxReplacementsPerHour": "5",
        "dataBucket": "my-datasets",
        "dataPrefix": "digits",
        "dataChecksums": "required",
        "efa": "true",
        "nodeBootSeconds": "1800",
        "idleStopMinutes": "15",
        "idleStopMasterMinutes": "30",
        "budgetPerDay": "250.50",
        "warmPoolSize": "0",  # not with spotWorkers (tests/stack/test_warm_pool.py)
        "logRetentionDays": "90",
        "alarmEmail": "ops@example.com",
        "efsIoAlarmGiBPerHour": "200",
        "clusterUsers": "alice, bob_2",
        "sharedStorage": "fsx-lustre",
        "resumeFrom": "s3://old-ckpts/checkpoints/old-cluster",
        "scheduler": "slurm",
        "allowedImages": "123456789012.dkr.ecr.us-east-1.amazonaws.com/team, nvcr.io/nvidia",
    }
    # vpcCidr and natGateways are a new VPC's (not with vpcId): parsed in test_cdk_cli.py
    # and below, and in test_one_zone.py.
    assert set(ctx) == set(CONTEXT_KEYS) - set(CAPACITY_CONTEXT_KEYS) - {
        "vpcCidr", "natGateways"} | {"availabilityZones"}
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
        vpc_id="vpc-0123456789abcdef0",
        vpc_private_subnet_ids=("subnet-0123456789abcdef0", "subnet-0123456789abcdef1"),
        vpc_public_subnet_ids=("subnet-0123456789abcdef2", "subnet-0123456789abcdef3"),
        availability_zones=("us-east-1a", "us-east-1b"),
        root_volume_gib=500,
        placement_group=True,
        max_workers=8,
        spot_workers=2,
        data_prep_script="/efs/prep.sh --fast",
        max_replacements_per_hour=5,
        data_bucket="my-datasets",
        data_prefix="digits/",
        data_checksums="required",
        efa=True,
        node_boot_seconds=1800,
        idle_stop_minutes=15,
        idle_stop_master_minutes=30,
        budget_per_day=250.5,
        log_retention_days=90,
        alarm_email="ops@example.com",
        efs_io_alarm_gib_per_hour=200,
        cluster_users=("alice", "bob_2"),
        shared_storage="fsx-lustre",
        resume_from=("s3://old-ckpts/checkpoints/old-cluster/",),
        scheduler="slurm",
        allowed_images=("123456789012.dkr.ecr.us-east-1.amazonaws.com/team", "nvcr.io/nvidia"),
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
        ("dataBucket", "My_Bucket"),
        ("dataBucket", "ab"),
        ("dataBucket", "192.168.1.1"),
        ("dataPrefix", "/abs"),
        ("dataPrefix", "a/*"),
        ("dataPrefix", "a/../b"),
        ("dataChecksums", "strict"),
        ("dataChecksums", "Required"),
        ("idleStopMinutes", "-1"),
        ("idleStopMinutes", "10081"),
        ("idleStopMinutes", "soon"),
        ("idleStopMasterMinutes", "-1"),
        ("idleStopMasterMinutes", "later"),
        ("clusterUsers", "root"),
        ("clusterUsers", "Alice"),
        ("clusterUsers", "alice,alice"),
        ("clusterUsers", "al ice"),
        ("scheduler", "pbs"),
        ("scheduler", "Slurm"),
        ("allowedImages", "https://nvcr.io/nvidia"),
    ],
)
def test_bad_values_name_key_and_value(key: str, value: str) -> None:
    with pytest.raises(ConfigError) as err:
        settings(**{key: value})
    message = str(err.value)
    assert key in message and repr(value) in message, message


def test_a_data_prefix_needs_a_data_bucket() -> None:
    with pytest.raises(ConfigError) as err:
        settings(dataPrefix="digits")
    assert "'dataPrefix'" in str(err.value) and "'dataBucket'" in str(err.value)


def test_a_new_vpcs_cidr_is_parsed() -> None:
    assert settings(vpcCidr="10.1.0.0/16").vpc_cidr == "10.1.0.0/16"


def test_numbers_from_cdk_json_are_accepted() -> None:
    assert settings(workerCount=4, placementGroup=False).worker_count == 4


def test_elastic_defaults_and_max_below_the_deployed_count() -> None:
    s = settings()
    assert (s.max_workers, s.spot_workers, s.data_prep_script) == (None, 0, None)
    with pytest.raises(ConfigError) as err:
        settings(workerCount="3", spotWorkers="2", maxWorkers="4")
    assert "'maxWorkers' must be at least workerCount + spotWorkers (5), got 4" in str(err.value)


def test_context_errors_name_the_key_not_a_construct() -> None:
    """app.py prints this after "error: " (docs/settings.md)."""
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


# -- one description per setting; unknown keys; values checked against their limits ------------


def test_unknown_key_is_refused_with_the_closest_known_one() -> None:
    from stacks.context import refuse_unknown_keys

    known = set(CONTEXT_KEYS)
    with pytest.raises(ConfigError) as err:
        refuse_unknown_keys({"workercount": "3"}, known)
    assert str(err.value) == "unknown context key 'workercount'; did you mean 'workerCount'?"
    with pytest.raises(ConfigError, match="did you mean 'efsMountPoint'"):
        refuse_unknown_keys({"efsMountPiont": "/x"}, known)
    with pytest.raises(ConfigError, match=r"unknown context key 'zzz' \(docs/settings\.md"):
        refuse_unknown_keys({"zzz": "1"}, known)


def test_the_cdks_own_context_keys_are_not_checked() -> None:
    """cdk.json's feature flags and the keys the CDK CLI and its lookups add are not ours."""
    from stacks.context import refuse_unknown_keys
    from tests.stack.synth import cdk_json_context

    refuse_unknown_keys({**cdk_json_context(), "aws:cdk:enable-path-metadata": True,
                         "aws-cdk:enableDiffNoFail": True, "acknowledged-issue-numbers": [1],
                         "availability-zones:account=1:region=us-east-1": ["a"],
                         "workerCount": "2"}, set(CONTEXT_KEYS))


def test_the_app_refuses_a_misspelt_key() -> None:
    """build_app reads every context key, not only the ones it asks for."""
    import app as app_module
    from tests.stack.synth import new_app

    with pytest.raises(ConfigError, match="did you mean 'workerCount'"):
        app_module.build_app(new_app(workercount="3"))
    with pytest.raises(ConfigError, match="did you mean 'emrCoreInstanceCount'"):
        app_module.build_app(new_app(emrCoreInstanceCounts="3"))


@pytest.mark.parametrize(("ctx", "message"), [
    ({"sshCidr": "0.0.0.0/1"}, "context key 'sshCidr' opens SSH to 2,147,483,648 addresses, "
     "wider than the /16 limit, got '0.0.0.0/1'; give a narrower range, or set "
     "sshAllowWideCidr=true if you mean it"),
    ({"sshCidr": "10.0.0.0/15"}, "wider than the /16 limit, got '10.0.0.0/15'"),
    ({"efsMountPoint": "/etc"}, "context key 'efsMountPoint' must not be on, under or above "
     "the system directory /etc"),
    ({"efsMountPoint": "/var/lib/data"}, "system directory /var/lib"),
    ({"efsMountPoint": "/usr/"}, "system directory /usr"),
    ({"efsMountPoint": "/opt"}, "system directory /opt/deeplearning"),
    ({"efsMountPoint": "//proc"}, "system directory /proc"),
    ({"efsMountPoint": "/data/./x"}, "must be an absolute directory path"),
    ({"workerCount": "100000"}, "context key 'workerCount' must be at most 1000, "
     "got '100000'"),
    ({"spotWorkers": "5000"}, "context key 'spotWorkers' must be at most 1000"),
    ({"maxWorkers": "1001"}, "context key 'maxWorkers' must be at most 1000"),
    ({"maxZoneMoves": "11"}, "context key 'maxZoneMoves' must be at most 10"),
    ({"launchRetrySeconds": "3300"}, "context key 'launchRetrySeconds' must be at most 3299"),
    ({"rootVolumeGiB": "20000"}, "context key 'rootVolumeGiB' must be at most 16384 GiB"),
    ({"masterInstanceType": "zz.zz"}, "context key 'masterInstanceType' must be an EC2 "
     "instance type like g5.xlarge (family.size"),
    ({"workerInstanceType": "p5.48xlargee"}, "got 'p5.48xlargee'"),
    ({"workerInstanceTypes": "p5.48xlarge,p4d.24xlargee"}, "got 'p4d.24xlargee'"),
    ({"sshAllowWideCidr": "perhaps"}, "context key 'sshAllowWideCidr' must be true or false"),
])
def test_values_are_checked_against_their_limits(ctx: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        settings(**ctx)
    assert message in str(err.value)


def test_a_wide_ssh_range_needs_the_opt_in_and_real_types_pass() -> None:
    assert settings(sshCidr="10.0.0.0/8", sshAllowWideCidr="true").ssh_cidr == "10.0.0.0/8"
    assert settings(sshCidr="198.51.0.0/16").ssh_cidr == "198.51.0.0/16"
    assert settings(efsMountPoint="/data/shared/").efs_mount_point == "/data/shared"
    for name in ("g5.xlarge", "p5.48xlarge", "p4d.24xlarge", "trn1n.32xlarge", "m7i-flex.large",
                 "p6-b200.48xlarge", "u-6tb1.112xlarge", "c5.metal", "mac2-m2pro.metal",
                 "c6i.metal-32xl", "t3.nano", "inf2.xlarge", "dl1.24xlarge"):
        assert settings(workerInstanceType=name).worker_instance_type == name


def test_every_field_is_described_and_every_key_is_unique() -> None:
    """The dataclass is the one description: no field without a key, no key twice."""
    import dataclasses

    from constructs_lib.emr_settings import EmrSettings
    from constructs_lib.setting import described_fields

    for cls in (ClusterSettings, EmrSettings):
        described = described_fields(cls)
        assert len(described) == len(dataclasses.fields(cls)), cls
        assert all(s.doc and s.key for _f, s in described)
    keys = [s.key for cls in (ClusterSettings, EmrSettings) for _f, s in described_fields(cls)]
    assert len(keys) == len(set(keys))


def test_readme_settings_table_is_the_generated_one() -> None:
    """docs/settings.md's table comes from ClusterSettings: regenerate it with
    `python -m stacks.settings_doc --write` after changing a setting."""
    from stacks.settings_doc import PAGE, readme_table, settings_table

    assert readme_table(PAGE.read_text()) == settings_table()


def test_the_generated_table_follows_the_description(tmp_path) -> None:
    from stacks.settings_doc import END, START, readme_table, settings_table, write_readme

    table = settings_table()
    assert "| `workerCount` | `2` | 1 to 1000 |" in table
    assert "| `maxWorkers` | workerCount + spotWorkers | 1 to 1000 |" in table
    stale = tmp_path / "README.md"
    stale.write_text(f"intro\n{START}\n| old | table |\n{END}\nrest\n")
    assert readme_table(stale.read_text()) != table
    assert write_readme(stale) and readme_table(stale.read_text()) == table
    assert stale.read_text().startswith("intro\n") and stale.read_text().endswith("rest\n")


# -- an existing VPC (vpcId) and an existing file system in it ----------------------------------

VPC = {"vpcId": "vpc-0123456789abcdef0",
       "vpcPrivateSubnetIds": "subnet-0123456789abcdef0,subnet-0123456789abcdef1",
       "availabilityZones": "us-east-1a,us-east-1b"}


@pytest.mark.parametrize(("ctx", "message"), [
    ({"efsFileSystemId": "fs-0123abcd"}, "context key 'efsFileSystemId' needs 'vpcId'"),
    ({"vpcId": "vpc-0123456789abcdef0"}, "'vpcId' needs 'vpcPrivateSubnetIds' and "
     "'availabilityZones'"),
    ({**VPC, "vpcCidr": "10.1.0.0/16"}, "'vpcCidr' is the CIDR of a new VPC and does not go "
     "with 'vpcId'"),
    ({**VPC, "availabilityZones": "us-east-1a"}, "'vpcPrivateSubnetIds' must list one subnet "
     "per zone of 'availabilityZones' (1: us-east-1a), got 2"),
    ({**VPC, "sshCidr": "203.0.113.0/24"}, "'sshCidr' with 'vpcId' needs 'vpcPublicSubnetIds'"),
    ({"vpcPrivateSubnetIds": "subnet-0123456789abcdef0"}, "'vpcPrivateSubnetIds' is for an "
     "existing VPC and needs 'vpcId'"),
    ({"vpcId": "vpc-xyz"}, "context key 'vpcId' must look like vpc-0123456789abcdef0, "
     "got 'vpc-xyz'"),
    ({**VPC, "vpcPrivateSubnetIds": "subnet-1,subnet-2"}, "context key 'vpcPrivateSubnetIds' "
     "must list subnet ids"),
])
def test_existing_vpc_keys_are_refused_clearly(ctx: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        settings(**ctx)
    assert message in str(err.value)


def test_existing_file_system_in_an_existing_vpc_synthesizes_without_lookups() -> None:
    """efsFileSystemId used to get a mount-target group in a new VPC its file system is not
    in; with vpcId the stack creates no VPC and puts every group in the given one."""
    from tests.stack.synth import cluster_template

    t = cluster_template(**VPC, efsFileSystemId="fs-0123456789abcdef0")
    t.resource_count_is("AWS::EC2::VPC", 0)
    t.resource_count_is("AWS::EFS::FileSystem", 0)
    res = t.to_json()["Resources"]
    groups = [r["Properties"]["VpcId"] for r in res.values()
              if r["Type"] == "AWS::EC2::SecurityGroup"]
    assert groups and set(groups) == {"vpc-0123456789abcdef0"}
    subnets = [r["Properties"]["VPCZoneIdentifier"] for r in res.values()
               if r["Type"] == "AWS::AutoScaling::AutoScalingGroup"]
    # one zone by default: the first of availabilityZones, its subnet (the same order)
    assert subnets == [VPC["vpcPrivateSubnetIds"].split(",")[:1]] * 2
    spread = cluster_template(**VPC, efsFileSystemId="fs-0123456789abcdef0",
                              placementGroup="false").to_json()["Resources"]
    assert [r["Properties"]["VPCZoneIdentifier"] for r in spread.values()
            if r["Type"] == "AWS::AutoScaling::AutoScalingGroup"] == [
        VPC["vpcPrivateSubnetIds"].split(",")] * 2


def test_the_emulators_clusters_take_the_stacks_defaults(monkeypatch) -> None:
    """emulator.resources restates no default: a changed construct default reaches the
    user data of its directly-built clusters."""
    import dataclasses

    from constructs_lib import cluster, node_group
    from constructs_lib.cluster_settings import ClusterSettings
    from emulator import resources

    resources.stack_defaults.cache_clear()
    real = resources.stack_defaults()
    assert real.mount_point == ClusterSettings().efs_mount_point
    assert (real.setup_timeout, real.min_workers, real.drain_heartbeat, real.drain_hook) == (
        cluster.SETUP_TIMEOUT_SECONDS, cluster.DEFAULT_MIN_WORKERS,
        node_group.DRAIN_HEARTBEAT_SECONDS, node_group.DRAIN_HOOK_NAME)
    monkeypatch.setattr(cluster, "SETUP_TIMEOUT_SECONDS", 1234)
    fields = {f.name: f for f in dataclasses.fields(ClusterSettings)}
    monkeypatch.setattr(fields["efs_mount_point"], "default", "/shared")
    resources.stack_defaults.cache_clear()
    try:
        settings = resources.agent_settings("master", cluster_id="c")
        assert (settings["setup-timeout"], settings["mount-point"]) == ("1234", "/shared")
    finally:
        resources.stack_defaults.cache_clear()


def test_the_constructs_prop_docs_state_the_settings_defaults() -> None:
    """Each prop a setting feeds documents, under ``:default:``, the default the setting
    description has (so help(DeepLearningCluster) and the README agree)."""
    import inspect
    import re

    from constructs_lib import DeepLearningCluster
    from constructs_lib.setting import described_fields

    doc = inspect.getdoc(DeepLearningCluster.__init__) or ""
    props = inspect.signature(DeepLearningCluster.__init__).parameters
    renamed = {"placement_group": "create_placement_group"}
    checked = 0
    for field, desc in described_fields(ClusterSettings):
        prop = renamed.get(field.name, field.name)
        literal = (desc.default_doc or "").startswith("`")  # not a computed default
        if prop not in props or (field.default is None and not literal):
            continue
        block = re.search(rf":param {prop}:(.*?)(?=:param |\Z)", doc, re.S)
        assert block, f"{prop} is not documented"
        default = block.group(1).split(":default:")[-1]
        expected = desc.default_doc.strip("`") if field.default is None else \
            str(field.default)
        assert expected.split("`")[0] in default, (field.name, expected, default)
        checked += 1
    assert checked >= 8


def test_launch_retry_window_reaches_the_capacity_adjuster() -> None:
    """``-c launchRetrySeconds`` is the Lambda's LAUNCH_RETRY_SECONDS (default 600)."""
    assert settings().launch_retry_seconds == 600
    template = cluster_template(launchRetrySeconds="45")
    envs = [fn["Properties"].get("Environment", {}).get("Variables", {})
            for fn in template.find_resources("AWS::Lambda::Function").values()]
    assert any(env.get("LAUNCH_RETRY_SECONDS") == "45" for env in envs), envs


def test_data_checksums_reaches_every_nodes_installer() -> None:
    """``-c dataChecksums=required``: both groups' user data give the installer
    ``--data-checksums required`` (dl-run's default on every node; the node's side:
    tests/jobs/test_data_checksums_default.py); unset, ``warn``."""
    def user_data(t) -> list[str]:
        out = []
        for lt in t.find_resources("AWS::EC2::LaunchTemplate").values():
            parts = lt["Properties"]["LaunchTemplateData"]["UserData"]["Fn::Base64"][
                "Fn::Join"][1]
            out.append("".join(p if isinstance(p, str) else "<token>" for p in parts))
        return out

    assert settings().data_checksums == "warn"
    for ctx, mode in (({"dataChecksums": "required"}, "required"), ({}, "warn")):
        texts = user_data(cluster_template(**ctx))
        assert len(texts) == 2 and all(f"--data-checksums '{mode}'" in u for u in texts), ctx
