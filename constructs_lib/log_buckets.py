"""The bucket that receives another bucket's S3 server access logs.

Server access logs (who read, wrote or deleted which object) go to a bucket of their own:
S3-managed keys (the only encryption a log target bucket supports: AWS-KMS is refused for
server access log delivery), TLS-only, no public access, bucket-owner-enforced (CDK grants
the logging service principal ``logging.s3.amazonaws.com`` in its bucket policy, as AWS
documents for that ownership setting), RETAINed with the bucket it watches:
https://docs.aws.amazon.com/AmazonS3/latest/userguide/enable-server-access-logging.html
"""

from __future__ import annotations

from aws_cdk import RemovalPolicy
from aws_cdk import aws_s3 as s3
from constructs import Construct


def access_log_bucket(scope: Construct, construct_id: str = "AccessLogs") -> s3.Bucket:
    """A new bucket for server access logs (module doc). It logs nowhere itself: a log
    bucket that logged to itself would log its own deliveries forever."""
    return s3.Bucket(
        scope, construct_id, encryption=s3.BucketEncryption.S3_MANAGED, enforce_ssl=True,
        block_public_access=s3.BlockPublicAccess.BLOCK_ALL, versioned=True,
        object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
        removal_policy=RemovalPolicy.RETAIN)
