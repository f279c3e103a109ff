"""Every AWS call ``dlc`` makes, in one place (the operator policy in
constructs_lib/operator_access.py grants exactly these).

The cluster is read from the APIs, never from a template: the stack's outputs name the two
Auto Scaling groups and the file system; the groups list the instances; EC2 gives each
instance's address, type and state.
"""

from __future__ import annotations

import contextlib
import datetime
import time
from dataclasses import asdict, dataclass, field

from dlc.errors import AwsError, NotFound, listing
from dlc.target import EMULATOR_HINT, Target

#: The stack outputs dlc reads.
MASTER_GROUP_OUTPUT = "MasterGroupName"
WORKER_GROUP_OUTPUT = "WorkerGroupName"
FILE_SYSTEM_OUTPUT = "FileSystemId"
CHECKPOINT_BUCKET_OUTPUT = "CheckpointBucketName"
CLUSTER_TAG_KEY = "dl-cluster:id"
#: The resource type of the cluster's Command document (constructs_lib/operator_document.py).
DOCUMENT_TYPE = "AWS::SSM::Document"


#: What to do next, by AWS's error code (or botocore's exception name): each credential or
#: permission failure says the command that fixes it.
NEXT_STEP = {
    **dict.fromkeys(("AccessDenied", "AccessDeniedException", "UnauthorizedOperation"),
                    "attach the stack's OperatorPolicyArn policy to your role or user"),
    "NoCredentialsError": "no AWS credentials found: run `aws configure` (or `aws sso login "
                          "--profile NAME`) and pass `--profile NAME` or set AWS_PROFILE; "
                          + EMULATOR_HINT,
    **dict.fromkeys(("ExpiredToken", "ExpiredTokenException", "RequestExpired",
                     "TokenRetrievalError", "SSOTokenLoadError"),
                    "your session expired: renew it (`aws sso login --profile NAME`, or new "
                    "temporary credentials), then try again"),
    **dict.fromkeys(("InvalidClientTokenId", "UnrecognizedClientException",
                     "SignatureDoesNotMatch", "AuthFailure"),
                    "AWS does not accept these credentials: check which identity they are "
                    "with `aws sts get-caller-identity` (and --profile / AWS_PROFILE)"),
    "NoRegionError": f"no region: pass --region REGION (or set AWS_REGION); {EMULATOR_HINT}",
    "EndpointConnectionError": "AWS's endpoint is unreachable from here: check the network, "
                               "a proxy, or --region",
    "ProfileNotFound": "that profile is not in ~/.aws/config: `aws configure list-profiles` "
                       "lists the ones there are",
}


def aws_error(exc: Exception, what: str) -> AwsError:
    """An AWS failure as one line: the call, AWS's code and message, and the next step
    (``code`` keeps AWS's code for a caller that explains it better)."""
    code = getattr(exc, "response", {}).get("Error", {}).get("Code", type(exc).__name__)
    msg = getattr(exc, "response", {}).get("Error", {}).get("Message", str(exc))
    hint = f" ({NEXT_STEP[code]})" if code in NEXT_STEP else ""
    err = AwsError(f"{what} failed: {code}: {msg}{hint}")
    err.code = code
    return err


def call(what: str, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` with AWS errors turned into :class:`AwsError`."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return fn(*args, **kwargs)
    except ClientError as exc:
        raise aws_error(exc, what) from None
    except BotoCoreError as exc:  # no credentials, no region, no network: botocore's own
        raise aws_error(exc, what) from None


@dataclass
class Stack:
    name: str
    status: str
    outputs: dict[str, str]
    stack_id: str = ""

    def output(self, key: str) -> str:
        if not self.outputs.get(key):
            raise NotFound(f"stack {self.name} has no output {key} (outputs: "
                           f"{listing(sorted(self.outputs))}): was it deployed from this "
                           "repository's DLClusterStack?")
        return self.outputs[key]


@dataclass
class Instance:
    """One instance of the cluster's groups, as Auto Scaling and EC2 see it."""

    instance_id: str
    role: str  # master | worker
    group: str
    lifecycle: str  # InService, Pending, Terminating:Wait, ...
    health: str  # Healthy | Unhealthy (Auto Scaling's view)
    address: str = ""
    instance_type: str = ""
    state: str = ""  # EC2: running, terminated, ...
    launch_time: str = ""
    tags: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def describe_stack(target: Target) -> Stack:
    """The stack, or NotFound naming the stacks that do exist in the region."""
    from botocore.exceptions import ClientError

    cfn = target.client("cloudformation")
    try:
        desc = cfn.describe_stacks(StackName=target.stack)["Stacks"][0]
    except ClientError as exc:
        if "does not exist" in str(exc):
            raise NotFound(f"stack {target.stack} not found in {target.region}; stacks "
                           f"there: {listing(_stack_names(cfn), 'none (or not visible)')}"
                           " (--stack NAME picks another)") from None
        raise aws_error(exc, f"DescribeStacks {target.stack}") from None
    outputs = {o["OutputKey"]: o.get("OutputValue", "") for o in desc.get("Outputs", [])}
    return Stack(desc["StackName"], desc["StackStatus"], outputs, desc.get("StackId", ""))


def stack_exists(target: Target) -> Stack | None:
    try:
        return describe_stack(target)
    except NotFound:
        return None


def _stack_names(cfn) -> list[str]:
    with contextlib.suppress(Exception):  # listing is a courtesy: it may be denied
        stacks = cfn.describe_stacks()["Stacks"]
        return sorted(s["StackName"] for s in stacks if s["StackStatus"] != "DELETE_COMPLETE")
    return []


def stack_events(target: Target, stack_id: str, seen: set[str] | None = None) -> list[dict]:
    """The stack's events, oldest first (DescribeStackEvents lists newest first); paging
    stops at the first page that reaches an event in ``seen``."""
    cfn = target.client("cloudformation")
    events: list[dict] = []
    token = None
    while True:
        kwargs = {"StackName": stack_id, **({"NextToken": token} if token else {})}
        page = call(f"DescribeStackEvents {target.stack}", cfn.describe_stack_events, **kwargs)
        events.extend(page.get("StackEvents", []))
        token = page.get("NextToken")
        if not token or (seen and any(e["EventId"] in seen for e in events)):
            return list(reversed(events))


def stack_resources(target: Target) -> list[dict]:
    cfn = target.client("cloudformation")
    return call(f"DescribeStackResources {target.stack}", cfn.describe_stack_resources,
                StackName=target.stack)["StackResources"]


def groups(target: Target, stack: Stack) -> dict[str, dict]:
    """role -> the Auto Scaling group's description."""
    names = {"master": stack.output(MASTER_GROUP_OUTPUT),
             "worker": stack.output(WORKER_GROUP_OUTPUT)}
    asg = target.client("autoscaling")
    found = call("DescribeAutoScalingGroups", asg.describe_auto_scaling_groups,
                 AutoScalingGroupNames=list(names.values()))["AutoScalingGroups"]
    by_name = {g["AutoScalingGroupName"]: g for g in found}
    missing = [n for n in names.values() if n not in by_name]
    if missing:
        raise NotFound(f"stack {stack.name} names Auto Scaling group(s) "
                       f"{listing(missing)} that do not exist (stack status {stack.status})")
    return {role: by_name[name] for role, name in names.items()}


def instances(target: Target, stack: Stack) -> list[Instance]:
    """Every instance of the master and worker groups, master first."""
    out: list[Instance] = []
    for role, g in groups(target, stack).items():
        for i in g.get("Instances", []):
            out.append(Instance(i["InstanceId"], role, g["AutoScalingGroupName"],
                                i.get("LifecycleState", ""), i.get("HealthStatus", ""),
                                instance_type=i.get("InstanceType", "")))
    ids = [i.instance_id for i in out]
    if ids:
        ec2 = target.client("ec2")
        pages = call("DescribeInstances", ec2.describe_instances, InstanceIds=ids)
        described = {x["InstanceId"]: x for r in pages["Reservations"] for x in r["Instances"]}
        for inst in out:
            x = described.get(inst.instance_id, {})
            inst.address = x.get("PrivateIpAddress", "")
            inst.instance_type = x.get("InstanceType", inst.instance_type)
            inst.state = x.get("State", {}).get("Name", "")
            lt = x.get("LaunchTime")
            inst.launch_time = lt.isoformat() if isinstance(lt, datetime.datetime) else str(
                lt or "")
            inst.tags = {t["Key"]: t["Value"] for t in x.get("Tags", [])}
    return out


def master_instance(target: Target, stack: Stack, nodes: list[Instance]) -> Instance:
    """The master group's running instance (the one the channel talks to)."""
    masters = [n for n in nodes if n.role == "master"]
    live = [n for n in masters if n.lifecycle == "InService" and n.state in ("running", "")]
    if not live:
        stopped = ("; the idle stop may have stopped it (idleStopMasterMinutes): dlc up or "
                   "dlc submit wakes it" if not masters else "")
        raise NotFound(f"stack {stack.name} has no running master instance (master group "
                       f"{stack.outputs.get(MASTER_GROUP_OUTPUT, '?')}: "
                       f"{listing([f'{n.instance_id} {n.lifecycle}/{n.state}' for n in masters])})"
                       f"{stopped}")
    return sorted(live, key=lambda n: n.health != "Healthy")[0]


# -- SSM Run Command ------------------------------------------------------------------------


def operator_documents(target: Target) -> list[str]:
    """The names of the stack's Command documents (the stack's resources list them): the
    any-user one (a name CloudFormation generated) and one per cluster user
    (``dl-op.<cluster id>.<user>``); :func:`dlc.remote.choose_document` picks one."""
    return [r["PhysicalResourceId"] for r in stack_resources(target)
            if r.get("ResourceType") == DOCUMENT_TYPE and r.get("PhysicalResourceId")]


def caller_arn(target: Target) -> str:
    """The caller's ARN (GetCallerIdentity needs no permission)."""
    sts = target.client("sts")
    return call("GetCallerIdentity", sts.get_caller_identity)["Arn"]


def principal_tag(target: Target, arn: str, key: str) -> str | None:
    """The value of tag ``key`` of the IAM user or role behind ``arn`` (iam:ListUserTags /
    iam:ListRoleTags, which the operator policy does not grant: None when IAM refuses, or
    for anything else). A session tag cannot be read back at all; IAM still decides with
    it, so this is only a guess at which document to try."""
    from botocore.exceptions import BotoCoreError, ClientError

    kind, _, rest = arn.rpartition(":")[2].partition("/")  # user/[path/]name, assumed-role/R/s
    parts = rest.split("/")
    iam = target.client("iam")
    try:
        if kind == "user" and parts[-1]:
            tags = iam.list_user_tags(UserName=parts[-1])["Tags"]
        elif kind == "assumed-role" and len(parts) >= 2:
            tags = iam.list_role_tags(RoleName=parts[0])["Tags"]
        else:
            return None
    except (ClientError, BotoCoreError):
        return None
    return next((t["Value"] for t in tags if t.get("Key") == key), None)


def send_command(target: Target, instance_id: str, document: str, parameters: dict[str, str],
                 *, comment: str, delivery_timeout: int) -> str:
    """Run the cluster's Command document on the instance; returns the command id. SSM
    checks every value against the document's allowedPattern first (InvalidParameters)."""
    ssm = target.client("ssm")
    res = call(f"SendCommand {document} to {instance_id}", ssm.send_command,
               InstanceIds=[instance_id], DocumentName=document,
               Comment=comment[:100], TimeoutSeconds=delivery_timeout,
               Parameters={k: [v] for k, v in parameters.items()})
    return res["Command"]["CommandId"]


def command_invocation(target: Target, command_id: str, instance_id: str) -> dict | None:
    """GetCommandInvocation, or None while SSM does not know the invocation yet (it is
    eventually consistent right after SendCommand)."""
    from botocore.exceptions import ClientError

    ssm = target.client("ssm")
    try:
        return ssm.get_command_invocation(CommandId=command_id, InstanceId=instance_id)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") == "InvocationDoesNotExist":
            return None
        raise aws_error(exc, f"GetCommandInvocation {command_id}") from None


# -- Pricing and EFS ------------------------------------------------------------------------


def on_demand_products(target: Target, instance_type: str, region: str) -> list[str]:
    """The Price List entries (JSON text) of a Linux, shared-tenancy instance type in a
    region. The Price List API is served from us-east-1."""
    from botocore.config import Config

    # A cost estimate must not hold up dlc status: one short attempt.
    quick = Config(connect_timeout=3, read_timeout=5,
                   retries={"total_max_attempts": 1, "mode": "standard"})
    pricing = target.client("pricing", region="us-east-1", config=quick)
    filters = [("instanceType", instance_type), ("regionCode", region),
               ("operatingSystem", "Linux"), ("tenancy", "Shared"),
               ("preInstalledSw", "NA"), ("capacitystatus", "Used"),
               ("licenseModel", "No License required")]
    res = call("pricing GetProducts", pricing.get_products, ServiceCode="AmazonEC2",
               Filters=[{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in filters],
               MaxResults=10)
    return list(res.get("PriceList", []))


def cost_tag_status(target: Target, key: str) -> str:
    """Billing's status of the user-defined cost allocation tag ``key``: ``Active``,
    ``Inactive``, or "" when Billing has not seen it used yet (Cost Explorer's API is served
    from us-east-1). AwsError when it cannot be asked (e.g. AccessDenied)."""
    from botocore.config import Config

    quick = Config(connect_timeout=3, read_timeout=5,
                   retries={"total_max_attempts": 1, "mode": "standard"})
    ce = target.client("ce", region="us-east-1", config=quick)
    res = call("ce ListCostAllocationTags", ce.list_cost_allocation_tags, TagKeys=[key],
               Type="UserDefined")
    found = [t for t in res.get("CostAllocationTags", []) if t.get("TagKey") == key]
    return str(found[0].get("Status", "")) if found else ""


def delete_file_system(target: Target, file_system_id: str, *, timeout: float = 300) -> None:
    """Delete the file system once no mount target is left (its stack deleted them)."""
    efs = target.client("efs")
    deadline = time.monotonic() + timeout
    while True:
        targets = call("DescribeMountTargets", efs.describe_mount_targets,
                       FileSystemId=file_system_id).get("MountTargets", [])
        if not targets:
            break
        if time.monotonic() > deadline:
            raise AwsError(f"file system {file_system_id} still has mount targets "
                           f"{listing([t['MountTargetId'] for t in targets])} after "
                           f"{timeout:.0f} s; not deleted")
        time.sleep(5)
    call(f"DeleteFileSystem {file_system_id}", efs.delete_file_system,
         FileSystemId=file_system_id)


def delete_bucket(target: Target, bucket: str) -> int:
    """Empty a (versioned) bucket, every version and delete marker, then delete it; the
    number of versions deleted. S3 deletes only an empty bucket:
    https://docs.aws.amazon.com/AmazonS3/latest/userguide/delete-bucket.html"""
    s3 = target.client("s3")
    deleted = 0
    pages = s3.get_paginator("list_object_versions").paginate(Bucket=bucket)
    for page in call(f"ListObjectVersions {bucket}", list, pages):
        batch = [{"Key": v["Key"], "VersionId": v["VersionId"]}
                 for v in page.get("Versions", []) + page.get("DeleteMarkers", [])]
        for i in range(0, len(batch), 1000):  # DeleteObjects takes at most 1000 keys
            call(f"DeleteObjects {bucket}", s3.delete_objects, Bucket=bucket,
                 Delete={"Objects": batch[i:i + 1000], "Quiet": True})
        deleted += len(batch)
    call(f"DeleteBucket {bucket}", s3.delete_bucket, Bucket=bucket)
    return deleted


def schedule_key_deletion(target: Target, key_id: str, days: int = 7) -> None:
    """KMS deletes a key only after a waiting period (7 to 30 days), cancellable meanwhile."""
    kms = target.client("kms")
    call(f"ScheduleKeyDeletion {key_id}", kms.schedule_key_deletion, KeyId=key_id,
         PendingWindowInDays=days)
