"""Deploy the stack to the emulator with the real CDK CLI, then read back what it created.

Nothing here shortcuts the product: ``npx cdk bootstrap`` + ``npx cdk deploy DLClusterStack``
against moto's endpoint, and the nodes are later started from what the deployed resources
say (the groups' instances, the launch templates' user data, the function's environment).
"""

from __future__ import annotations

import base64
import os
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from emulator.address_space import vpc_cidr

REPO_ROOT = Path(__file__).resolve().parent.parent
STACK = "DLClusterStack"
ACCOUNT = "123456789012"
REGION = "us-east-1"
CLUSTER_TAG_KEY = "dl-cluster:id"
ROLE_TAG_KEY = "NodeType"
INSTALL_MODULE = "bootstrap_scripts.agent.install"


class DeployError(RuntimeError):
    """The CLI or the deployed stack is not what the emulator needs; message says what."""


def aws_env(endpoint: str) -> dict[str, str]:
    """The variables every emulated process (CLI, boto3, agents) needs to reach moto only."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": REGION,
        "AWS_REGION": REGION,
    }


def cli_env(endpoint: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("AWS_PROFILE",)}
    env.update(aws_env(endpoint))
    env.update({
        "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "18,20",
        "JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION": "1",
        "JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION": "1",
        "CDK_DISABLE_VERSION_CHECK": "1",
        "CDK_CLI_NOTICES": "false",
        "CI": "true",  # no interactive progress bars in the log
    })
    venv_bin = str(REPO_ROOT / ".venv" / "bin")
    env["PATH"] = venv_bin + os.pathsep + env.get("PATH", "")
    return env


def run_cli(args: list[str], *, env: dict[str, str], log: Path, what: str,
            timeout: float = 600) -> float:
    """Run ``npx cdk <args>``; returns seconds taken; DeployError with the log's tail."""
    t0 = time.monotonic()
    with open(log, "ab") as fh:
        fh.write(f"$ npx cdk {shlex.join(args)}\n".encode())
        fh.flush()
        proc = subprocess.Popen(["npx", "--no-install", "cdk", *args], cwd=REPO_ROOT, env=env,
                                stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            raise DeployError(f"{what} took longer than {timeout:.0f} s (log: {log})") from None
        except BaseException:
            os.killpg(proc.pid, 9)
            proc.wait()
            raise
    if rc != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
        raise DeployError(f"{what} failed with exit status {rc} (log: {log}):\n{tail}")
    return time.monotonic() - t0


def pick_ami(ec2) -> str:
    """moto refuses the public DLAMI SSM parameter, so pass one of moto's own AMIs."""
    images = ec2.describe_images(Owners=["amazon"])["Images"]
    if not images:
        raise DeployError("moto lists no Amazon-owned AMI to launch the nodes from")
    return sorted(images, key=lambda i: i["ImageId"])[0]["ImageId"]


def bootstrap(env: dict[str, str], log: Path, outdir: Path) -> float:
    """``cdk bootstrap`` of the one account and region, named: with an app configured the CLI
    would synthesize the whole app first only to list its environments (``--app ""``
    leaves cdk.json's context, the qualifier included, in force)."""
    return run_cli(["bootstrap", f"aws://{ACCOUNT}/{REGION}", "--app", "", "--output",
                    str(outdir)], env=env, log=log, what="cdk bootstrap")


def deploy(env: dict[str, str], log: Path, outdir: Path, *, workers: int, ami: str,
           context: dict[str, str] | None = None) -> float:
    extra = [a for k, v in (context or {}).items() for a in ("-c", f"{k}={v}")]
    return run_cli(["deploy", STACK, "--require-approval", "never", "--progress", "events",
                    "--output", str(outdir), "-c", f"vpcCidr={vpc_cidr()}", "-c", f"amiId={ami}",
                    "-c", f"workerCount={workers}", *extra], env=env, log=log,
                   what="cdk deploy")


@dataclass
class Instance:
    instance_id: str
    address: str
    state: str
    instance_type: str


@dataclass
class Group:
    name: str
    role: str  # master | worker
    desired: int
    min_size: int
    max_size: int
    instances: list[Instance]
    user_data: str
    install_args: list[str]
    #: The launch template's instance profile and its role ("" without one).
    instance_profile_arn: str = ""
    role_arn: str = ""


@dataclass
class Cluster:
    cluster_id: str
    groups: dict[str, Group]  # role -> group
    function_name: str
    function_env: dict[str, str]
    outputs: dict[str, str] = field(default_factory=dict)
    resource_count: int = 0
    topic_arn: str = ""

    @property
    def master(self) -> Group:
        return self.groups["master"]

    @property
    def worker(self) -> Group:
        return self.groups["worker"]


def install_args_from_user_data(user_data: str, group: str) -> list[str]:
    """The arguments the user data passes to ``python -m bootstrap_scripts.agent.install``."""
    for line in reversed(user_data.splitlines()):
        tokens = shlex.split(line, comments=True) if INSTALL_MODULE in line else []
        if INSTALL_MODULE in tokens:
            return tokens[tokens.index(INSTALL_MODULE) + 1:]
    raise DeployError(f"the user data of group {group} never runs `-m {INSTALL_MODULE}`; "
                      f"the emulator cannot tell how nodes start. Last lines:\n"
                      + "\n".join(user_data.splitlines()[-5:]))


def launch_template_data(ec2, group: dict) -> dict:
    """The ``LaunchTemplateData`` of the version the group launches."""
    spec = group.get("LaunchTemplate") or (group.get("MixedInstancesPolicy") or {}).get(
        "LaunchTemplate", {}).get("LaunchTemplateSpecification")
    if not spec:
        raise DeployError(f"group {group['AutoScalingGroupName']} has no launch template")
    ref = ({"LaunchTemplateId": spec["LaunchTemplateId"]} if spec.get("LaunchTemplateId")
           else {"LaunchTemplateName": spec["LaunchTemplateName"]})
    versions = ec2.describe_launch_template_versions(**ref)["LaunchTemplateVersions"]
    wanted = str(spec.get("Version", "$Latest"))
    chosen = versions[0]
    if wanted not in ("$Latest", "$Default"):
        chosen = next((v for v in versions if str(v["VersionNumber"]) == wanted), chosen)
    return chosen["LaunchTemplateData"]


def group_user_data(ec2, group: dict) -> str:
    raw = launch_template_data(ec2, group).get("UserData", "")
    if not raw:
        raise DeployError(f"launch template of {group['AutoScalingGroupName']} has no user data")
    return base64.b64decode(raw).decode()


def instance_role(session, data: dict) -> tuple[str, str]:
    """(instance profile ARN, its role's ARN) of a launch template's ``IamInstanceProfile``,
    the role EC2 hands the instances' credentials for; ("", "") without one."""
    ref = data.get("IamInstanceProfile") or {}
    name = ref.get("Name") or str(ref.get("Arn", "")).rsplit("/", 1)[-1]
    if not name:
        return "", ""
    profile = session.client("iam").get_instance_profile(
        InstanceProfileName=name)["InstanceProfile"]
    roles = profile.get("Roles") or []
    if len(roles) != 1:
        raise DeployError(f"instance profile {name} has {len(roles)} roles, expected one")
    return profile["Arn"], roles[0]["Arn"]


def read_cluster(session, stack: str = STACK) -> Cluster:
    """What the deployed stack created, read from the APIs (never from the template)."""
    cfn = session.client("cloudformation")
    asg = session.client("autoscaling")
    ec2 = session.client("ec2")
    lam = session.client("lambda")
    desc = cfn.describe_stacks(StackName=stack)["Stacks"][0]
    if desc["StackStatus"] != "CREATE_COMPLETE" and desc["StackStatus"] != "UPDATE_COMPLETE":
        raise DeployError(f"stack {stack} is {desc['StackStatus']}, expected CREATE_COMPLETE")
    outputs = {o["OutputKey"]: o.get("OutputValue", "") for o in desc.get("Outputs", [])}
    resources = cfn.describe_stack_resources(StackName=stack)["StackResources"]

    groups: dict[str, Group] = {}
    cluster_id = ""
    for g in asg.describe_auto_scaling_groups()["AutoScalingGroups"]:
        tags = {t["Key"]: t["Value"] for t in g.get("Tags", [])}
        if tags.get(CLUSTER_TAG_KEY) != stack and CLUSTER_TAG_KEY not in tags:
            continue
        role = tags.get(ROLE_TAG_KEY, "").lower()
        if role not in ("master", "worker"):
            raise DeployError(f"group {g['AutoScalingGroupName']} has {ROLE_TAG_KEY}="
                              f"{tags.get(ROLE_TAG_KEY)!r}, expected Master or Worker")
        if role in groups:
            raise DeployError(f"two {role} groups carry {CLUSTER_TAG_KEY}: "
                              f"{groups[role].name}, {g['AutoScalingGroupName']}")
        cluster_id = tags[CLUSTER_TAG_KEY]
        user_data = group_user_data(ec2, g)
        profile_arn, role_arn = instance_role(session, launch_template_data(ec2, g))
        groups[role] = Group(
            name=g["AutoScalingGroupName"], role=role, desired=g["DesiredCapacity"],
            min_size=g["MinSize"], max_size=g["MaxSize"], instances=[], user_data=user_data,
            install_args=install_args_from_user_data(user_data, g["AutoScalingGroupName"]),
            instance_profile_arn=profile_arn, role_arn=role_arn)
    for role in ("master", "worker"):
        if role not in groups:
            raise DeployError(f"no Auto Scaling group tagged {CLUSTER_TAG_KEY} + "
                              f"{ROLE_TAG_KEY}={role.title()} after deploying {stack}")
    refresh_instances(session, groups.values())

    functions = [r.get("PhysicalResourceId", "") for r in resources
                 if r.get("ResourceType") == "AWS::Lambda::Function"]
    function_name, function_env = "", {}
    for name in functions:
        conf = lam.get_function_configuration(FunctionName=name)
        env = (conf.get("Environment") or {}).get("Variables") or {}
        if conf.get("Handler") == "capacity_adjuster.handler" or "MASTER_QUEUE_URL" in env:
            function_name, function_env = conf["FunctionName"], dict(env)
            break
    if not function_name:
        raise DeployError(f"no capacity-adjuster function (handler capacity_adjuster.handler) "
                          f"among the stack's functions {functions}")
    # the capacity adjuster's (the groups' notifications), not the alarm topic
    topics = [r.get("PhysicalResourceId", "") for r in resources
              if r.get("ResourceType") == "AWS::SNS::Topic"
              and "CapacityAdjuster" in r.get("LogicalResourceId", "")]
    topic_arn = topics[0] if topics else f"arn:aws:sns:{REGION}:{ACCOUNT}:{stack}-notifications"
    return Cluster(cluster_id=cluster_id, groups=groups, function_name=function_name,
                   function_env=function_env, outputs=outputs, resource_count=len(resources),
                   topic_arn=topic_arn)


def refresh_instances(session, groups) -> None:
    """Re-read each group's instances (id, loopback address, lifecycle state, type)."""
    asg = session.client("autoscaling")
    ec2 = session.client("ec2")
    for group in groups:
        g = asg.describe_auto_scaling_groups(
            AutoScalingGroupNames=[group.name])["AutoScalingGroups"][0]
        group.desired, group.min_size, group.max_size = (g["DesiredCapacity"], g["MinSize"],
                                                         g["MaxSize"])
        ids = [i["InstanceId"] for i in g["Instances"]]
        states = {i["InstanceId"]: i["LifecycleState"] for i in g["Instances"]}
        info: dict[str, dict] = {}
        if ids:
            for res in ec2.describe_instances(InstanceIds=ids)["Reservations"]:
                for inst in res["Instances"]:
                    info[inst["InstanceId"]] = inst
        group.instances = [
            Instance(i, info[i].get("PrivateIpAddress", ""), states[i],
                     info[i].get("InstanceType", ""))
            for i in ids if i in info]
