"""Every cdk-nag (AwsSolutions) acknowledgement of the project, each with its reason.

One place on purpose: a reviewer reads this file to know every rule we do not follow and
why. Findings not listed here fail `cdk synth`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aws_cdk import Acknowledgment, Validations
from constructs import IConstruct

from constructs_lib.allowed_images import prefix_patterns
from constructs_lib.job_role import USER_TAG as JOB_USER_TAG

if TYPE_CHECKING:  # pragma: no cover
    from constructs_lib.cluster import DeepLearningCluster
    from constructs_lib.emr_cluster import EmrDeepLearningCluster
    from constructs_lib.operator_access import OperatorAccess

DESCRIBE_APIS_REASON = (
    "autoscaling:DescribeAutoScalingGroups, autoscaling:DescribeScalingActivities and "
    "ec2:DescribeInstances support no resource-level permissions; they are read-only and the "
    "node agent / capacity adjuster need them to find the cluster's instances."
)
HEALTH_GATE_REASON = (
    " The master's health gate also calls ec2:DescribeInstanceTypes (each node's GPUs against "
    "its instance type's), which supports no resource-level permissions either "
    "(https://docs.aws.amazon.com/service-authorization/latest/reference/list_amazonec2.html)."
    " The job controller prices each job's nodes with pricing:GetProducts and "
    "ec2:DescribeSpotPriceHistory, read-only calls without resource-level permissions "
    "(https://docs.aws.amazon.com/service-authorization/latest/reference/"
    "list_awspricelist.html)."
)
CAPACITY_BLOCK_REASON = (
    " With a Capacity Block the function also reads the block's end time at deploy time "
    "(Custom::CapacityBlockEnd) with ec2:DescribeCapacityReservations, which supports no "
    "resource-level permissions (https://docs.aws.amazon.com/service-authorization/latest/"
    "reference/list_amazonec2.html): it cannot be scoped to the block, and it only reads."
)
SSM_CORE_REASON = (
    "AmazonSSMManagedInstanceCore is the AWS-maintained minimum for SSM Session Manager, "
    "which replaces open SSH as the default way into the nodes; copying it inline would "
    "freeze a policy AWS keeps current."
)
TAG_CONDITIONED_REASON = (
    "Auto Scaling group ARNs contain a generated UUID; writes are limited to groups tagged "
    "dl-cluster:id=<this cluster> by an autoscaling:ResourceTag condition, which is exactly "
    "this cluster's two groups, without making the function depend on them."
)
ELASTIC_CONTROL_REASON = (
    "The master agent completes drain lifecycle actions and sets scale-in protection, and "
    "dl-scale changes the worker count: CompleteLifecycleAction, SetInstanceProtection, "
    "SetDesiredCapacity and TerminateInstanceInAutoScalingGroup (and the job controller's "
    "SetInstanceHealth for a failed node) are limited by an "
    "autoscaling:ResourceTag condition to groups tagged dl-cluster:id=<this cluster>; the "
    "group ARNs hold a generated UUID unknown when the role is created. The job controller's "
    "idle stop adds UpdateAutoScalingGroup on the worker group alone (its NodeType tag too), "
    "for its minimum and desired capacity only: a minimum no higher than deployed, and no "
    "launch template, launch configuration, instance types, subnets, maximum or capacity "
    "reservation in the request (constructs_lib/idle_stop.py)."
)
WARM_READY_QUEUE_REASON = (
    "The warm-ready queue (warmPoolSize) has no dead-letter queue: a worker's ready message "
    "is useful only while its launch action waits (the queue keeps it that long); one the "
    "master refuses (not a session of the workers' role) is logged and deleted, and one it "
    "cannot act on is received again until it expires, after which the hook's ABANDON "
    "terminates the instance, which Auto Scaling replaces."
)
NODE_KEYS_QUEUE_REASON = (
    "The node-keys queue has no dead-letter queue: a worker sends its key again every few "
    "minutes and whenever the master changes, so a message the master refuses (logged, "
    "deleted) or cannot read (received again until it expires) is replaced by the next one."
)
HOOK_KEY_REASON = (
    "kms:GenerateDataKey* is what CDK's topic.grant_publish gives a publisher of a topic "
    "encrypted with a customer key (SNS asks for GenerateDataKey and "
    "GenerateDataKeyWithoutPlaintext); the statement's resource is that one key, and the "
    "role is assumable only by Auto Scaling to publish the drain hook's notifications."
)
DESIRED_CAPACITY_REASON = (
    "desiredCapacity is the cluster's worker count setting: a deploy is expected to restore "
    "it (the capacity adjuster lowers it only when launches fail)."
)


PROVIDER_LOGS_REASON = (
    "AWSLambdaBasicExecutionRole (CloudWatch Logs writes only) is what CDK gives the one "
    "AwsCustomResource provider function of a stack; that function only creates Auto "
    "Scaling's service-linked role on a fresh account (constructs_lib/service_linked_role.py) "
    "and its own role is limited to that call on that role's ARN."
)
MUNGE_KEY_ROTATION_REASON = (
    "The munge key (scheduler=slurm) is not rotated by a Lambda: every munged of the cluster "
    "must switch to a new key at the same moment or Slurm's daemons stop trusting each other "
    "mid-job, and a rotation function could only change the secret, not restart the nodes' "
    "daemons. The key lives as long as its cluster: a new stack makes a new one "
    "(constructs_lib/slurm.py), and only the node roles can read it."
)
IMAGE_PREFIX_REASON = (
    "A prefix of allowedImages names the ECR repository of that name and every repository "
    "under it (repository/<prefix>/*): the administrator listed the prefix, and the pull "
    "actions only read images; ecr:GetAuthorizationToken names no resource (ECR's own rule).")


def _ack(construct: IConstruct, rule: str, reason: str) -> None:
    Validations.of(construct).acknowledge(Acknowledgment(id=rule, reason=reason))


def acknowledge_cluster_findings(cluster: DeepLearningCluster) -> None:
    """Acknowledge the findings a DeepLearningCluster knowingly raises, and only those."""
    for group in (cluster.master_group, cluster.worker_group):
        _ack(group.role, "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/"
             "AmazonSSMManagedInstanceCore]", SSM_CORE_REASON)
        _ack(group.role, "AwsSolutions-IAM5[Resource::*]", DESCRIBE_APIS_REASON + (
            HEALTH_GATE_REASON if group is cluster.master_group else ""))
        _ack(group.auto_scaling_group, "@aws-cdk/aws-autoscaling:desiredCapacitySet",
             DESIRED_CAPACITY_REASON)
    _ack(cluster.master_group.role, "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:"
         "autoscaling:<AWS::Region>:<AWS::AccountId>:autoScalingGroup:*:autoScalingGroupName/*]",
         ELASTIC_CONTROL_REASON)
    _ack(cluster.node_keys.queue, "AwsSolutions-SQS3", NODE_KEYS_QUEUE_REASON)
    if cluster.munge_key is not None:
        _ack(cluster.munge_key.secret, "AwsSolutions-SMG4", MUNGE_KEY_ROTATION_REASON)
    if cluster.warm_ready_queue is not None:
        _ack(cluster.warm_ready_queue, "AwsSolutions-SQS3", WARM_READY_QUEUE_REASON)
    _ack(cluster.drain_hook.role, "AwsSolutions-IAM5[Action::kms:GenerateDataKey*]",
         HOOK_KEY_REASON)
    for group in (cluster.master_group, cluster.worker_group):
        if group.mixed_instances:
            _ack(group.auto_scaling_group, "AwsSolutions-EC26",
                 "The root volume IS encrypted (gp3, Encrypted=true in the launch template, "
                 "asserted by tests/stack); with Spot workers or an instance-type fallback "
                 "list the group names that template inside a MixedInstancesPolicy, which "
                 "cdk-nag 3's EC26 rule cannot follow (it errors on the intrinsic reference).")
    for pattern in prefix_patterns(cluster.allowed_images):
        for group in (cluster.master_group, cluster.worker_group):
            _ack(group.role, f"AwsSolutions-IAM5[Resource::{pattern}]", IMAGE_PREFIX_REASON)
    adjuster = cluster.capacity_adjuster
    _ack(adjuster.role, "AwsSolutions-IAM5[Resource::*]", DESCRIBE_APIS_REASON + (
        CAPACITY_BLOCK_REASON if cluster.capacity.capacity_block_id else ""))
    _ack(adjuster.role, "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:autoscaling:"
         "<AWS::Region>:<AWS::AccountId>:autoScalingGroup:*:autoScalingGroupName/*]",
         TAG_CONDITIONED_REASON)
    acknowledge_operator_access(cluster.operator_access)
    acknowledge_custom_resource_provider(cluster)
    staged = (f"AwsSolutions-IAM5[Resource::<{_logical_id(cluster.workdir_staging.bucket)}"
              ".Arn>/workdirs/*]")
    access = cluster.operator_access
    _ack(access.policy, staged.replace("/workdirs/*", f"/workdirs/<aws:PrincipalTag/"
                                                      f"{access.user_tag}>/*"),
         "dlc submit --workdir uploads each directory under a new random key "
         "(workdirs/<user>/<id>.tar.gz); operators may only put objects under "
         "workdirs/<their own dl-user tag>/ of the cluster's own staging bucket (no read, "
         "list or delete).")
    _ack(access.admin_policy, staged,
         "Administrators submit as any cluster user (the any-user Command document), so they "
         "may put under workdirs/ of the cluster's own staging bucket (no read, list or "
         "delete); keys are new random ones, made by dlc.")
    _ack(cluster.master_group.role, staged,
         "The master fetches the staged directory a submit names (keys are random, made "
         "by dlc); only s3:GetObject under workdirs/ of the cluster's own staging bucket.")
    acknowledge_training_data(cluster)


def acknowledge_training_data(cluster: DeepLearningCluster) -> None:
    """The object wildcards of the data and checkpoint grants (constructs_lib/
    training_data.py): a prefix's objects have names the jobs choose."""
    data = cluster.training_data
    jobs = cluster.job_role.role
    _ack(jobs, f"AwsSolutions-IAM5[Resource::{_bucket_arn(data.checkpoint_bucket)}/"
         f"{data.checkpoint_prefix}<aws:PrincipalTag/{JOB_USER_TAG}>/*]",  # cdk-nag's spelling
         "Checkpoints have names the jobs choose (step numbers, ranks); reads and writes are "
         "limited to the job's own user's prefix checkpoints/<cluster-id>/<user>/ of the "
         "checkpoint bucket (the session tag the executor sets), with no delete.")
    if data.data_bucket is not None:
        _ack(jobs, f"AwsSolutions-IAM5[Resource::"
             f"{_bucket_arn(data.data_bucket)}/{data.data_prefix}*]",
             "A dataset is many objects whose names the user chooses; s3:GetObject only, "
             "limited to the dataBucket's dataPrefix (dl-run --data stages it).")
    for source in cluster.resume_from:
        _ack(jobs, f"AwsSolutions-IAM5[Resource::{_bucket_arn(source.bucket)}/"
             f"{source.prefix}<aws:PrincipalTag/{JOB_USER_TAG}>/*]",
             "An old cluster's checkpoints (resumeFrom) have names its jobs chose; "
             "s3:GetObject only, limited to the job's own user's part of that cluster's "
             "checkpoints/<cluster-id>/ (the session tag the executor sets).")
    if cluster.resume_from:
        _ack(jobs, "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:kms:<AWS::Region>:"
             "<AWS::AccountId>:key/*]",
             "The old clusters' checkpoint keys (resumeFrom) belong to stacks this one does "
             "not know; kms:Decrypt only, only through S3 in this region (kms:ViaService) and "
             "only for those buckets' objects (the kms:EncryptionContext:aws:s3:arn "
             "condition).")


def acknowledge_custom_resource_provider(scope: IConstruct) -> None:
    """The AwsCustomResource provider function of ``scope``'s stack, if it has one."""
    from aws_cdk import Stack
    from aws_cdk import custom_resources as cr

    provider_id = "AWS" + cr.AwsCustomResource.PROVIDER_FUNCTION_UUID.replace("-", "")
    provider = Stack.of(scope).node.try_find_child(provider_id)
    if provider is None:
        return
    role = provider.node.try_find_child("ServiceRole")
    _ack(role or provider, "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/"
         "service-role/AWSLambdaBasicExecutionRole]", PROVIDER_LOGS_REASON)


def acknowledge_operator_access(access: OperatorAccess) -> None:
    """The operator and admin policies' wildcards (constructs_lib/operator_access.py), each
    scoped."""
    prefix = "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:"
    _ack(access.policy, "AwsSolutions-IAM5[Resource::*]",
         "autoscaling:DescribeAutoScalingGroups, ec2:DescribeInstances, "
         "ssm:GetCommandInvocation and pricing:GetProducts support no resource-level "
         "permissions; all four only read.")
    for policy in (access.policy, access.admin_policy):
        _ack(policy, f"{prefix}ec2:<AWS::Region>:<AWS::AccountId>:instance/*]",
             "ssm:SendCommand and ssm:StartSession on instances are limited by an "
             "ssm:resourceTag/dl-cluster:id condition to this cluster's instances, whose ids "
             "change with every replacement.")
        for variable in ("aws:userid", "aws:username"):
            _ack(policy,
                 f"{prefix}ssm:<AWS::Region>:<AWS::AccountId>:session/<{variable}>-*]",
                 "Session ids start with the caller's name: TerminateSession and "
                 "ResumeSession are allowed on the caller's own sessions only, as AWS's "
                 "Session Manager examples do.")
    _ack(access.policy, f"{prefix}autoscaling:<AWS::Region>:<AWS::AccountId>:"
         "autoScalingGroup:*:autoScalingGroupName/*]",
         "dlc submit / dlc up wake a master the idle stop stopped (idleStopMasterMinutes): "
         "UpdateAutoScalingGroup only on the group tagged as this cluster's master "
         "(autoscaling:ResourceTag conditions), with a minimum and maximum of at most 1 and "
         "no launch template, launch configuration, instance types, subnets or capacity "
         "reservation in the request (constructs_lib/idle_stop.py); the group ARN holds a "
         "generated UUID.")


def acknowledge_emr_findings(cluster: EmrDeepLearningCluster) -> None:
    """Acknowledge the findings an EmrDeepLearningCluster knowingly raises, and only those."""
    role = cluster.instance_role
    _ack(role, "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/"
         "AmazonSSMManagedInstanceCore]", SSM_CORE_REASON)
    _ack(role, "AwsSolutions-IAM5[Resource::*]",
         "ec2:DescribeInstanceTypes supports no resource-level permissions; it is read-only "
         "and gives every node the GPU count of each instance type for the membership.")
    _ack(role, "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:elasticmapreduce:"
         "<AWS::Region>:<AWS::AccountId>:cluster/*]",
         "The cluster id exists only after the cluster is created, and the nodes need "
         "ListInstances/DescribeCluster while it boots; an elasticmapreduce:ResourceTag "
         "condition on dl-cluster:id limits the statement to this cluster.")
    _ack(role, f"AwsSolutions-IAM5[Resource::<{_logical_id(cluster.log_bucket)}.Arn>/"
         "emr-logs/*]",
         "EMR's log pusher writes objects with generated names under the log prefix; only "
         "s3:PutObject under emr-logs/ of the cluster's own log bucket is allowed.")
    _ack(cluster.security_group_release.role, "AwsSolutions-IAM5[Resource::*]",
         "ec2:DescribeSecurityGroups supports no resource-level permissions; it only reads. "
         "The function's revokes are limited to the cluster's three managed groups "
         "(constructs_lib/emr_teardown.py).")
    _ack(cluster.service_role, "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/"
         "service-role/AmazonEMRServicePolicy_v2]",
         "AmazonEMRServicePolicy_v2 is AWS's scoped-down EMR service policy (the broad v1 "
         "AmazonElasticMapReduceRole is not used): its EC2 writes are limited to resources "
         "tagged for-use-with-amazon-emr-managed-policies=true. EMR's internal calls change "
         "with releases, so an inline copy would break clusters silently.")
    # cdk-nag 3.0.2's EMR4/EMR5 read EnableAtRestEncryption / EnableInTransitEncryption at
    # the TOP level of the security configuration, but EMR only accepts them inside
    # "EncryptionConfiguration" (where we put them): the rules cannot pass for a valid one.
    _ack(cluster.cluster, "AwsSolutions-EMR4",
         "Local disk encryption IS enabled: the cluster's security configuration sets "
         "EncryptionConfiguration.EnableAtRestEncryption=true with a KMS "
         "LocalDiskEncryptionConfiguration (and EBS encryption), asserted by "
         "tests/emr/test_emr_construct.py. cdk-nag 3.0.2 looks for these keys at the top "
         "level of the document, where EMR rejects them.")
    if cluster.in_transit_encryption:
        _ack(cluster.cluster, "AwsSolutions-EMR5",
             "In-transit encryption IS enabled (EncryptionConfiguration."
             "EnableInTransitEncryption=true with a PEM certificate provider); cdk-nag 3.0.2 "
             "looks for the keys at the top level of the document, where EMR rejects them.")
    else:
        _ack(cluster.cluster, "AwsSolutions-EMR5",
             "EMR in-transit encryption needs a certificate provider (a zip of PEM "
             "certificates in S3 or a custom provider) that only the user can supply: set "
             "tls_certificates_s3_url (context emrTlsCertificatesS3Url) to enable it. Until "
             "then traffic stays inside the private subnet and EFS is mounted with TLS.")
    if not cluster.cluster.instances.ec2_key_name:  # type: ignore[union-attr]
        _ack(cluster.cluster, "AwsSolutions-EMR6",
             "No SSH key pair and no Kerberos on purpose: people reach the nodes through SSM "
             "Session Manager (IAM-authenticated and logged) and submit training as EMR "
             "steps (dl-submit), so there is no password or key to manage.")


def _bucket_arn(bucket: IConstruct) -> str:
    """A bucket's ARN as cdk-nag prints it: ``<LogicalId.Arn>`` for one of the stack's,
    ``arn:<AWS::Partition>:s3:::name`` for one imported by name."""
    from aws_cdk import Token

    name = bucket.bucket_name  # type: ignore[attr-defined]
    if Token.is_unresolved(name):
        return f"<{_logical_id(bucket)}.Arn>"
    return f"arn:<AWS::Partition>:s3:::{name}"


def _logical_id(construct: IConstruct) -> str:
    from aws_cdk import Stack

    child = construct.node.default_child or construct
    return Stack.of(construct).get_logical_id(child)  # type: ignore[arg-type]
