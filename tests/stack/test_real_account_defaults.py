"""What decides whether a first deploy to a real account works, asserted on the synthesized
templates: the default image and how it mounts EFS, the PyTorch line in the DLAMI parameter,
nodes that boot only once EFS can be mounted, EFA interfaces, and where a failed capacity-
adjuster invocation goes (docs/node-agent.md "The machine image", "Mounting EFS";
docs/capacity-adjuster.md "Lost notifications")."""

from __future__ import annotations

import json

import aws_cdk as cdk
import pytest
from aws_cdk.assertions import Template

from constructs_lib import DeepLearningCluster
from constructs_lib.images import IMAGE_FAMILIES, dlami_parameter
from constructs_lib.user_data import MOUNT_TIMEOUT_SECONDS
from constructs_lib.validation import ConfigError
from tests.stack.synth import cluster_template, new_app

DLAMI = "/aws/service/deeplearning/ami/x86_64/oss-nvidia-driver-gpu-pytorch-{}/latest/ami-id"


@pytest.fixture(scope="module")
def default() -> Template:
    return cluster_template()


def user_data(t: Template) -> dict[str, str]:
    out = {}
    for lt in t.find_resources("AWS::EC2::LaunchTemplate").values():
        parts = lt["Properties"]["LaunchTemplateData"]["UserData"]["Fn::Base64"]["Fn::Join"][1]
        text = "".join(p if isinstance(p, str) else "<token>" for p in parts)
        out["master" if "--role 'master'" in text else "worker"] = text
    return out


def dlami_parameters(t: Template) -> list[str]:
    return [p["Default"] for k, p in t.to_json().get("Parameters", {}).items()
            if k.startswith("SsmParameterValue")]


def statements(t: Template, policy_fragment: str) -> list[dict]:
    found = [p for k, p in t.find_resources("AWS::IAM::Policy").items() if policy_fragment in k]
    assert len(found) == 1, policy_fragment
    return found[0]["Properties"]["PolicyDocument"]["Statement"]


# -- 12.1 / 12.2: the image, its PyTorch line, and how it mounts EFS --------------------------
def test_default_is_the_al2023_pytorch_dlami_which_installs_efs_utils(default: Template) -> None:
    assert dlami_parameters(default) == [DLAMI.format("2.13-amazon-linux-2023")]
    for role, text in user_data(default).items():
        assert "\nretry dnf install -y -q amazon-efs-utils || echo " in text, role
        assert f"--mount-timeout '{MOUNT_TIMEOUT_SECONDS}'" in text, role
        assert "PY=/opt/pytorch/bin/python" in text, role
    for lt in default.find_resources("AWS::EC2::LaunchTemplate").values():
        (bdm,) = lt["Properties"]["LaunchTemplateData"]["BlockDeviceMappings"]
        assert bdm["DeviceName"] == "/dev/xvda"


def test_tls_stays_required_by_default(default: Template) -> None:
    (fs,) = default.find_resources("AWS::EFS::FileSystem").values()
    deny = [s for s in fs["Properties"]["FileSystemPolicy"]["Statement"]
            if s["Effect"] == "Deny"]
    assert deny and deny[0]["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}


def test_ubuntu_and_another_pytorch_line() -> None:
    """The construct builds Ubuntu nodes for a file system that does not require TLS."""
    stack = cdk.Stack(new_app(), "Ubuntu")
    DeepLearningCluster(stack, "Cluster", image_type="ubuntu", pytorch_version="2.11",
                        efs_require_tls=False)
    t = Template.from_stack(stack)
    assert dlami_parameters(t) == [DLAMI.format("2.11-ubuntu-24.04")]
    for text in user_data(t).values():
        assert "dnf" not in text and "no amazon-efs-utils package" in text
    for lt in t.find_resources("AWS::EC2::LaunchTemplate").values():
        (bdm,) = lt["Properties"]["LaunchTemplateData"]["BlockDeviceMappings"]
        assert bdm["DeviceName"] == "/dev/sda1"


def test_ubuntu_with_the_tls_only_file_system_is_refused_at_synth() -> None:
    """Ubuntu's DLAMI has no mount.efs, so it could never mount the default (TLS-only) file
    system: refused at synth, naming the setting, the value and the way out."""
    with pytest.raises(ConfigError) as err:
        cluster_template(imageType="ubuntu")
    assert "context key 'imageType'='ubuntu' cannot mount" in str(err.value)
    assert "amazon-efs-utils" in str(err.value) and "amiId" in str(err.value)
    with pytest.raises(ConfigError, match=r"image_type='ubuntu' with the default file system.*"
                       r"efs_require_tls=False"):
        DeepLearningCluster(cdk.Stack(new_app(), "U"), "Cluster", image_type="ubuntu")
    # A custom AMI is the user's to have amazon-efs-utils.
    t = cluster_template(imageType="ubuntu", amiId="ami-0123456789abcdef0")
    assert dlami_parameters(t) == []


@pytest.mark.parametrize(("ctx", "words"), [
    ({"pytorchVersion": "1.0"}, ["'pytorchVersion'='1.0'", "'imageType'='amazon-linux-2023'",
                                 "pytorch-1.0-amazon-linux-2023", "2.13"]),
    ({"pytorchVersion": "2.13", "imageType": "ubuntu"},
     ["'pytorchVersion'='2.13'", "'imageType'='ubuntu'", "2.9, 2.10, 2.11, 2.12"]),
])
def test_a_pytorch_line_without_a_dlami_is_refused_at_synth(ctx: dict, words: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        cluster_template(**ctx)
    for word in words:
        assert word in str(err.value)
    with pytest.raises(ConfigError, match=r"pytorch_version='2.99' has no PyTorch Deep Learning "
                       r"AMI for image_type='amazon-linux-2023'"):
        DeepLearningCluster(cdk.Stack(new_app(), "P"), "Cluster", pytorch_version="2.99")


def test_every_default_line_is_a_published_one() -> None:
    for family in IMAGE_FAMILIES.values():
        assert family.default_pytorch == family.pytorch_lines[-1]


def test_parameter_names_follow_the_documented_form() -> None:
    """/aws/service/deeplearning/ami/<arch>/<DLAMI name without 'Deep Learning'/'AMI'>/
    latest/ami-id, e.g. 'Deep Learning OSS Nvidia Driver AMI GPU PyTorch 2.13 (Amazon Linux
    2023)' -> oss-nvidia-driver-gpu-pytorch-2.13-amazon-linux-2023."""
    assert dlami_parameter() == DLAMI.format("2.13-amazon-linux-2023")
    assert dlami_parameter("ubuntu") == DLAMI.format("2.12-ubuntu-24.04")
    assert {f: IMAGE_FAMILIES[f].default_pytorch for f in IMAGE_FAMILIES} == {
        "amazon-linux-2023": "2.13", "ubuntu": "2.12"}


def test_the_master_waits_the_node_boot_budget_for_registrations(default: Template) -> None:
    """A DLAMI boots in minutes: the master's registration wait is the boot budget (900 s by
    default, nodeBootSeconds), not the agent's 60-second default."""
    data = user_data(default)
    assert "--registration-wait '900'" in data["master"]
    assert "--registration-wait" not in data["worker"]
    assert "--registration-wait '1800'" in user_data(
        cluster_template(nodeBootSeconds="1800"))["master"]
    with pytest.raises(ConfigError, match=r"'nodeBootSeconds' must be an integer >= 60, got "
                                          r"'30'"):
        cluster_template(nodeBootSeconds="30")
    with pytest.raises(ConfigError, match=r"node_boot_seconds must be at most 300, got 400"):
        DeepLearningCluster(cdk.Stack(new_app(), "B"), "Cluster", setup_timeout_seconds=600,
                            node_boot_seconds=400)


def test_nodes_boot_only_once_every_mount_target_is_available(default: Template) -> None:
    targets = set(default.find_resources("AWS::EFS::MountTarget"))
    assert len(targets) == 2
    for name, group in default.find_resources("AWS::AutoScaling::AutoScalingGroup").items():
        assert targets <= set(group.get("DependsOn", [])), name


# -- 12.8: EFA ----------------------------------------------------------------------------------
def efa_templates(types: dict, **props: object) -> tuple[list[dict], str]:
    stack = cdk.Stack(new_app(), "Efa")
    cluster = DeepLearningCluster(stack, "Cluster", **types, **props)
    t = Template.from_stack(stack)
    node_sg = stack.resolve(cluster.node_security_group.security_group_id)
    data = [lt["Properties"]["LaunchTemplateData"]
            for lt in t.find_resources("AWS::EC2::LaunchTemplate").values()]
    assert len(data) == 2
    return data, node_sg


P5 = {"worker_instance_type": "p5.48xlarge", "master_instance_type": "p5.48xlarge"}


def test_without_efa_the_template_keeps_its_security_groups() -> None:
    data, node_sg = efa_templates(P5, efa=False)
    for d in data:
        assert "NetworkInterfaces" not in d and d["SecurityGroupIds"] == [node_sg]


def test_efa_on_every_network_card_of_a_p5() -> None:
    """p5.48xlarge has 32 network cards, each with EFA (DescribeInstanceTypes): the primary
    EFA interface on card 0, an EFA-only interface on cards 1 to 31."""
    data, node_sg = efa_templates(P5, efa=True)
    for d in data:
        interfaces = d["NetworkInterfaces"]
        assert [(i["NetworkCardIndex"], i["DeviceIndex"]) for i in interfaces] == [
            (card, 0) for card in range(32)]
        assert [i["InterfaceType"] for i in interfaces] == ["efa"] + ["efa-only"] * 31
        assert all(i["Groups"] == [node_sg] and i["DeleteOnTermination"] for i in interfaces)
        assert "SecurityGroupIds" not in d  # the interfaces carry the groups


def test_efa_on_a_single_card_type_is_the_one_primary_interface() -> None:
    data, node_sg = efa_templates({"worker_instance_type": "g5.12xlarge",
                                   "master_instance_type": "g5.12xlarge"}, efa=True)
    for d in data:
        assert d["NetworkInterfaces"] == [{"NetworkCardIndex": 0, "DeviceIndex": 0,
                                           "DeleteOnTermination": True, "Groups": [node_sg],
                                           "InterfaceType": "efa"}]


def test_a_type_whose_card_0_has_no_efa_keeps_an_ena_primary() -> None:
    data, _ = efa_templates({"worker_instance_type": "p6-b300.48xlarge",
                             "master_instance_type": "p4d.24xlarge"}, efa=True)
    layouts = sorted([(i["NetworkCardIndex"], i["InterfaceType"]) for i in d["NetworkInterfaces"]]
                     for d in data)
    assert [(0, "efa"), (1, "efa-only"), (2, "efa-only"), (3, "efa-only")] in layouts
    assert [(0, "interface")] + [(c, "efa-only") for c in range(1, 17)] in layouts


def test_efa_on_a_type_without_it_is_refused_naming_the_types_with_it() -> None:
    with pytest.raises(ConfigError) as err:
        efa_templates({"worker_instance_type": "g5.xlarge",
                       "master_instance_type": "g5.12xlarge"}, efa=True)
    message = str(err.value)
    assert "WorkerGroup: efa=True on g5.xlarge: no EFA on that instance type" in message
    for named in ("g5.12xlarge (1)", "p5.48xlarge (32)", "p4d.24xlarge (4)",
                  "trn1.32xlarge (8)"):
        assert named in message


def test_efa_refuses_what_one_launch_template_cannot_serve() -> None:
    with pytest.raises(ConfigError, match=r"same cards; got p5.48xlarge: 32 .*p4d.24xlarge: 4"):
        efa_templates({"worker_instance_types": ["p5.48xlarge", "p4d.24xlarge"],
                       "master_instance_type": "p5.48xlarge"}, efa=True)
    with pytest.raises(ConfigError, match=r"public address only to an instance launched with "
                       r"one network interface"):
        efa_templates(P5, efa=True, ssh_cidr="203.0.113.0/24")


def test_the_efa_table_is_what_describe_instance_types_says(moto_reset: str) -> None:
    """EFA_CARDS holds DescribeInstanceTypes' answer for the accelerated multi-card types:
    compared with moto's copy of the EC2 instance-type data (NetworkCards' InterfaceTypes,
    EfaInfo.MaximumEfaInterfaces), every accelerated EFA type of it."""
    import boto3

    from constructs_lib.efa import EFA_CARDS, EFA_SINGLE_CARD, accelerated, efa_cards

    ec2 = boto3.client("ec2", endpoint_url=moto_reset, region_name="us-east-1")
    checked = 0
    for page in ec2.get_paginator("describe_instance_types").paginate():
        for it in page["InstanceTypes"]:
            net, name = it["NetworkInfo"], it["InstanceType"]
            if not accelerated(name):
                continue
            # the tables list exactly the accelerated types with EFA (efa=True on any other
            # is refused at synth)
            assert bool(net.get("EfaSupported")) == (
                name in EFA_CARDS or name in EFA_SINGLE_CARD), name
            if not net.get("EfaSupported"):
                continue
            cards = sorted(c["NetworkCardIndex"] for c in net["NetworkCards"]
                           if "efa" in c.get("InterfaceTypes", ["efa"]))
            cards = cards[:net.get("EfaInfo", {}).get("MaximumEfaInterfaces", 1)]
            assert efa_cards(name) == tuple(cards), name
            checked += 1
    assert checked > 20  # the p, g and trn types with EFA


# -- 12.4: lost notifications --------------------------------------------------------------------
def test_failed_invocations_go_to_the_master_dead_letter_queue(default: Template) -> None:
    (config,) = default.find_resources("AWS::Lambda::EventInvokeConfig").values()
    props = config["Properties"]
    dlq = [k for k in default.find_resources("AWS::SQS::Queue") if "DeadLetters" in k]
    assert props["DestinationConfig"] == {"OnFailure": {"Destination": {
        "Fn::GetAtt": [dlq[0], "Arn"]}}}
    assert props["MaximumRetryAttempts"] == 2
    assert props["MaximumEventAgeInSeconds"] == 1800 < 3300  # inside the setup wait
    arn = {"Fn::GetAtt": [dlq[0], "Arn"]}
    send = [s for s in statements(default, "CapacityAdjusterRoleDefaultPolicy")
            if arn in (s["Resource"] if isinstance(s["Resource"], list) else [s["Resource"]])]
    assert len(send) == 1 and "sqs:SendMessage" in send[0]["Action"]


def test_only_the_master_may_look_at_the_dead_letter_queue(default: Template) -> None:
    (dlq,) = [k for k in default.find_resources("AWS::SQS::Queue") if "DeadLetters" in k]
    arn = {"Fn::GetAtt": [dlq, "Arn"]}

    def on_dlq(fragment: str) -> list:
        return [s["Action"] for s in statements(default, fragment) if s["Resource"] == arn]

    # No DeleteMessage: it only looks; SendMessage: a master-queue message it refused goes
    # there at once (docs/node-agent.md, "Messages it cannot process").
    assert on_dlq("MasterGroupInstanceRoleDefaultPolicy") == [
        ["sqs:GetQueueUrl", "sqs:ReceiveMessage", "sqs:SendMessage"]]
    assert on_dlq("WorkerGroupInstanceRoleDefaultPolicy") == []


def test_the_functions_log_group_is_encrypted_with_the_cluster_key(default: Template) -> None:
    (key_id,) = [k for k in default.find_resources("AWS::KMS::Key") if "CapacityAdjuster" in k]
    groups = {k: g["Properties"] for k, g in default.find_resources("AWS::Logs::LogGroup").items()
              if "CapacityAdjuster" in k}
    assert [g["KmsKeyId"] for g in groups.values()] == [{"Fn::GetAtt": [key_id, "Arn"]}]
    key = default.find_resources("AWS::KMS::Key")[key_id]["Properties"]["KeyPolicy"]
    (logs,) = [s for s in key["Statement"] if s.get("Sid") == "CloudWatchLogsEncryptsLogGroups"]
    assert "kms:EncryptionContext:aws:logs:arn" in json.dumps(logs["Condition"]["StringLike"])


def test_a_root_volume_below_the_floor_is_refused_naming_the_ami_snapshot_caveat():
    """EC2 refuses a root volume smaller than the AMI's root snapshot; synth cannot know the
    snapshot (the AMI is resolved at deploy time), so the floor's message says how to look."""
    from constructs_lib.validation import MIN_ROOT_VOLUME_GIB, root_volume

    assert root_volume("rootVolumeGiB", MIN_ROOT_VOLUME_GIB) == MIN_ROOT_VOLUME_GIB
    with pytest.raises(ConfigError) as refused:
        root_volume("rootVolumeGiB", MIN_ROOT_VOLUME_GIB - 1)
    message = str(refused.value)
    assert message.startswith(f"rootVolumeGiB must be at least {MIN_ROOT_VOLUME_GIB} GiB")
    assert "root snapshot" in message
    assert "aws ec2 describe-images --image-ids <ami> --query " \
           "'Images[0].BlockDeviceMappings', the root device's Ebs.VolumeSize" in message
    assert message.endswith(f"got {MIN_ROOT_VOLUME_GIB - 1}")
