"""TrainingData: the S3 side of a cluster's data and checkpoints.

- The data bucket is the user's own (an existing ``s3.IBucket``, optional): datasets live
  there before and after any cluster. The nodes may list it and read its objects under
  ``data_prefix`` and nothing else (no write: a job cannot damage the dataset).
- The checkpoint bucket is created by default: versioned (an overwritten or deleted checkpoint
  stays recoverable), encrypted with a rotating customer-managed KMS key of its own (S3 Bucket
  Keys on, so a large checkpoint costs few KMS calls), TLS-only, public access blocked,
  bucket-owner-enforced, server access logs in a bucket of their own, and RETAINed with its
  key when the stack is deleted (``dlc down`` keeps it unless ``--delete-data``). The nodes
  may read and write under ``checkpoints/<cluster-id>/`` only: a second cluster sharing the
  bucket cannot touch this one's checkpoints.

Both grants go to the cluster's job role (``job_role.py``), not to the node roles: jobs get
them through the credentials their executor issues, and each user's jobs may write only
``checkpoints/<cluster-id>/<user>/`` (the session's ``dl-user`` tag).

S3 permissions: https://docs.aws.amazon.com/AmazonS3/latest/userguide/using-with-s3-policy-actions.html
(``s3:ListBucket`` is on the bucket and takes the ``s3:prefix`` condition; object actions are
on ``bucket/key``). Buckets with SSE-KMS need ``kms:Decrypt`` to read and
``kms:GenerateDataKey`` to write:
https://docs.aws.amazon.com/AmazonS3/latest/userguide/UsingKMSEncryption.html
"""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from constructs import Construct

from constructs_lib import validation
from constructs_lib.log_buckets import access_log_bucket

#: Where a cluster's checkpoints go in the checkpoint bucket: ``checkpoints/<cluster-id>/``.
CHECKPOINT_PREFIX = "checkpoints/"
#: How long an overwritten or deleted checkpoint version stays recoverable.
DEFAULT_NONCURRENT_DAYS = 30
#: Incomplete multipart uploads (a node lost mid-upload) are aborted after this many days.
ABORT_INCOMPLETE_UPLOAD_DAYS = 7


class TrainingData(Construct):
    """The data bucket the nodes read and the checkpoint bucket they write (module doc)."""

    @validation.reports_path
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster_id: str,
        data_bucket: s3.IBucket | None = None,
        data_prefix: str = "",
        checkpoint_bucket: s3.IBucket | None = None,
        noncurrent_version_days: int = DEFAULT_NONCURRENT_DAYS,
    ) -> None:
        """
        :param cluster_id: the cluster's id; its checkpoints go under
            ``checkpoints/<cluster_id>/``.
        :param data_bucket: an existing bucket holding the training data (e.g.
            ``s3.Bucket.from_bucket_name``); give its ``encryption_key`` when it uses SSE-KMS.
            :default: none (the nodes get no data-bucket permission)
        :param data_prefix: the key prefix the nodes may read in ``data_bucket``.
            :default: ``""`` (the whole bucket)
        :param checkpoint_bucket: an existing bucket for the checkpoints instead of a new one.
            :default: a new versioned, KMS-encrypted, TLS-only, private bucket (RETAIN)
        :param noncurrent_version_days: days an overwritten or deleted checkpoint version
            is kept in the new bucket (not used with ``checkpoint_bucket``).
            :default: 30
        """
        super().__init__(scope, construct_id)
        self.cluster_id = cluster_id
        self.data_bucket = data_bucket
        self.data_prefix = validation.key_prefix("data_prefix", data_prefix)
        if data_bucket is None and self.data_prefix:
            raise validation.ConfigError(
                f"data_prefix is a prefix of data_bucket, which is not given; got "
                f"data_prefix={data_prefix!r}")
        noncurrent_version_days = validation.positive_int(
            "noncurrent_version_days", noncurrent_version_days)
        self.checkpoint_prefix = f"{CHECKPOINT_PREFIX}{cluster_id}/"
        self.checkpoint_key: kms.IKey | None = None
        self.access_logs: s3.IBucket | None = None
        if checkpoint_bucket is None:
            # Access logs are delivered under a bucket policy, not the log-delivery ACL that
            # a bucket-owner-enforced bucket refuses, whatever the app's feature flags say.
            self.node.set_context("@aws-cdk/aws-s3:serverAccessLogsUseBucketPolicy", True)
            # RETAINed like the bucket: a deleted key would make every checkpoint unreadable.
            self.checkpoint_key = kms.Key(
                self, "CheckpointKey", enable_key_rotation=True,
                removal_policy=RemovalPolicy.RETAIN,
                description="Encrypts the deep-learning cluster's checkpoint bucket")
            self.access_logs = access_log_bucket(self)
            checkpoint_bucket = s3.Bucket(
                self, "CheckpointBucket", encryption=s3.BucketEncryption.KMS,
                encryption_key=self.checkpoint_key, bucket_key_enabled=True,
                enforce_ssl=True, block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
                versioned=True, object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
                removal_policy=RemovalPolicy.RETAIN,
                server_access_logs_bucket=self.access_logs,
                server_access_logs_prefix="checkpoint-bucket/",
                lifecycle_rules=[s3.LifecycleRule(
                    id="OldVersionsAndLostUploads",
                    noncurrent_version_expiration=Duration.days(noncurrent_version_days),
                    abort_incomplete_multipart_upload_after=Duration.days(
                        ABORT_INCOMPLETE_UPLOAD_DAYS))])
        self.checkpoint_bucket: s3.IBucket = checkpoint_bucket

    @property
    def data_url(self) -> str:
        """``s3://bucket/prefix`` of the data the nodes may read ("" without a data bucket)."""
        if self.data_bucket is None:
            return ""
        return f"s3://{self.data_bucket.bucket_name}/{self.data_prefix}"

    @property
    def checkpoint_url(self) -> str:
        """``s3://bucket/checkpoints/<cluster-id>/``: where this cluster's checkpoints go."""
        return f"s3://{self.checkpoint_bucket.bucket_name}/{self.checkpoint_prefix}"

    def grant_data_read(self, role: iam.IRole) -> None:
        """List the data prefix and read its objects; nothing else of the bucket."""
        bucket = self.data_bucket
        if bucket is None:
            return
        _grant_prefix(role, bucket, self.data_prefix, sid="ReadTrainingData",
                      actions=["s3:GetObject"])
        if bucket.encryption_key is not None:
            bucket.encryption_key.grant(role, "kms:Decrypt")

    def grant_checkpoint_read_write(self, role: iam.IRole, per_user_tag: str = "") -> None:
        """List, read and write this cluster's checkpoint prefix (multipart uploads
        included); no delete (the bucket's lifecycle expires old versions), nothing else.
        With ``per_user_tag``, only ``<prefix><the session's tag value>/``."""
        bucket = self.checkpoint_bucket
        prefix = self.checkpoint_prefix + (f"${{aws:PrincipalTag/{per_user_tag}}}/"
                                           if per_user_tag else "")
        _grant_prefix(role, bucket, prefix, sid="ReadWriteCheckpoints",
                      actions=["s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload"])
        if bucket.encryption_key is not None:
            bucket.encryption_key.grant(role, "kms:Decrypt", "kms:GenerateDataKey")


def _grant_prefix(role: iam.IRole, bucket: s3.IBucket, prefix: str, *, sid: str,
                  actions: list[str]) -> None:
    """``actions`` on the objects under ``prefix`` and ``s3:ListBucket`` of that prefix only
    (the ``s3:prefix`` condition; an empty prefix is the whole bucket)."""
    role.add_to_principal_policy(iam.PolicyStatement(
        sid=sid, actions=actions, resources=[bucket.arn_for_objects(f"{prefix}*")]))
    listing = iam.PolicyStatement(sid=f"{sid}List", actions=["s3:ListBucket"],
                                  resources=[bucket.bucket_arn])
    if prefix:
        listing.add_condition("StringLike", {"s3:prefix": [f"{prefix}*"]})
    role.add_to_principal_policy(listing)
