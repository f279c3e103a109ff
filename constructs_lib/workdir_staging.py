"""WorkdirStaging: where ``dlc submit --workdir DIR`` puts a laptop directory on its way to
the cluster.

Why a bucket: the directory is too big for Run Command (a document parameter holds a few
kilobytes), so ``dlc`` uploads it as one archive here and the submit command names only its
key; the master's SSM Agent (root, the instance role) fetches it and the submitting user's
``dl-run`` unpacks it into the job's own directory on EFS.

Secure by default: the bucket is encrypted with a customer managed KMS key of its own (key
rotation on), refuses plain HTTP, blocks every kind of public access, is versioned,
bucket-owner-enforced and logs its access to a log bucket of its own (S3 server access
logs). Archives expire after ``expiration`` (the job has its copy on EFS), old versions
after a day, unfinished multipart uploads after a day. Least privilege: operators may only
put objects under ``workdirs/<their dl-user tag>/`` (:meth:`grant_stage` with
``per_user_tag``: an IAM policy variable, as their Command document is theirs; the admin
policy under ``workdirs/``), the master may only get them (:meth:`grant_fetch`), and both
reach the key through S3 only (``kms:ViaService``).

https://docs.aws.amazon.com/AmazonS3/latest/userguide/UsingKMSEncryption.html
https://docs.aws.amazon.com/AmazonS3/latest/userguide/mpuoverview.html (multipart uploads
with an AWS KMS key need kms:GenerateDataKey and kms:Decrypt)
"""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from constructs import Construct

from constructs_lib.log_buckets import access_log_bucket

#: The key prefix every staged directory goes under (``workdirs/<user>/<id>.tar.gz``).
PREFIX = "workdirs/"
#: CDK's feature flag for server access logs granted by bucket policy (not ACL).
LOGS_BY_BUCKET_POLICY = "@aws-cdk/aws-s3:serverAccessLogsUseBucketPolicy"
#: How long a staged archive is kept (the job unpacked it on EFS at submission).
DEFAULT_EXPIRATION_DAYS = 7


class WorkdirStaging(Construct):
    """The staging bucket and its key (module doc).

    :param expiration: how long a staged archive is kept.
        :default: ``Duration.days(7)``
    """

    def __init__(self, scope: Construct, construct_id: str, *,
                 expiration: Duration | None = None) -> None:
        super().__init__(scope, construct_id)
        # The log bucket is bucket-owner-enforced, so S3 delivers logs through its bucket
        # policy, not an ACL; set here (before any child) for apps without the flag.
        self.node.set_context(LOGS_BY_BUCKET_POLICY, True)
        self.key = kms.Key(
            self, "Key", enable_key_rotation=True, removal_policy=RemovalPolicy.RETAIN,
            description="dlc submit --workdir: the staged job directories")
        self.access_logs = access_log_bucket(self)
        self.bucket = s3.Bucket(
            self, "Bucket", encryption=s3.BucketEncryption.KMS, encryption_key=self.key,
            bucket_key_enabled=True, enforce_ssl=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL, versioned=True,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            removal_policy=RemovalPolicy.RETAIN,
            server_access_logs_bucket=self.access_logs, server_access_logs_prefix="staging/",
            lifecycle_rules=[s3.LifecycleRule(
                id="StagedDirectoriesExpire",
                expiration=expiration or Duration.days(DEFAULT_EXPIRATION_DAYS),
                noncurrent_version_expiration=Duration.days(1),
                abort_incomplete_multipart_upload_after=Duration.days(1))])

    @property
    def bucket_name(self) -> str:
        return self.bucket.bucket_name

    def _via_s3(self) -> dict:
        return {"StringEquals": {"kms:ViaService": f"s3.{Stack.of(self).region}.amazonaws.com"}}

    def grant_stage(self, policy: iam.ManagedPolicy, per_user_tag: str = "") -> None:
        """Operators: put (and abort their multipart uploads of) objects under ``workdirs/``;
        the key for that, through S3 only. No read, no list, no delete. With
        ``per_user_tag``, only under ``workdirs/<the caller's tag value>/``."""
        user = f"${{aws:PrincipalTag/{per_user_tag}}}/" if per_user_tag else ""
        policy.add_statements(
            iam.PolicyStatement(
                sid="StageWorkdirs", actions=["s3:PutObject", "s3:AbortMultipartUpload"],
                resources=[self.bucket.arn_for_objects(f"{PREFIX}{user}*")]),
            iam.PolicyStatement(
                sid="StageWorkdirsKey", actions=["kms:GenerateDataKey", "kms:Decrypt"],
                resources=[self.key.key_arn], conditions=self._via_s3()))

    def grant_fetch(self, role: iam.IRole) -> None:
        """The master: get objects under ``workdirs/``; decrypt them, through S3 only."""
        role.add_to_principal_policy(iam.PolicyStatement(
            actions=["s3:GetObject"], resources=[self.bucket.arn_for_objects(f"{PREFIX}*")]))
        role.add_to_principal_policy(iam.PolicyStatement(
            actions=["kms:Decrypt"], resources=[self.key.key_arn], conditions=self._via_s3()))
