"""Resume sources: another (older) cluster's checkpoints a new cluster's jobs may read.

``dlc down`` keeps a cluster's checkpoint bucket (RETAIN), so a job can go on in a new
cluster from where the old one stopped (``dlc submit --resume-from s3://…``). The new
cluster's job role may touch only its own checkpoint bucket; each resume source adds read
access, per user, to one old cluster's checkpoints:

- ``s3:GetObject`` on ``<bucket>/<prefix><the session's dl-user tag>/*`` and
  ``s3:ListBucket`` of that prefix only (the ``s3:prefix`` condition), so a user's job reads
  only that user's old checkpoints (the executor alone sets the tag: ``job_role.py``);
- ``kms:Decrypt`` of the bucket's KMS key, only when S3 asks for it on that bucket's behalf
  (``kms:ViaService`` = S3 in this region, and the encryption context S3 uses, the bucket's
  ARN with S3 Bucket Keys or the object's ARN without:
  https://docs.aws.amazon.com/AmazonS3/latest/userguide/UsingKMSEncryption.html#encryption-context).
  The key is not named because the old stack's key id is not known here; the conditions
  keep the grant to that one bucket. A key made by this library (CDK's default key policy
  lets the account's IAM policies grant its use) needs nothing more; a key whose policy
  does not delegate to IAM must name this job role itself.

The prefix is an old cluster's ``checkpoints/<cluster id>/`` exactly (given in full, no
wildcard), so no other cluster's or user's keys match. Same account and region only.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from aws_cdk import Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3

from constructs_lib import validation
from constructs_lib.validation import ConfigError

#: ``s3://bucket/checkpoints/<cluster id>/``: a cluster's checkpoint URL as
#: ``TrainingData.checkpoint_url`` (and the old stack's output) spells it.
_SOURCE_URL = re.compile(r"^s3://([^/]+)/(checkpoints/[A-Za-z0-9_-]{1,128}/)$")


@dataclass(frozen=True)
class CheckpointSource:
    """An old cluster's checkpoints: its bucket and its ``checkpoints/<cluster id>/`` prefix.

    :param bucket: the old cluster's checkpoint bucket (e.g. ``s3.Bucket.from_bucket_name``).
    :param prefix: ``checkpoints/<old cluster id>/``: users read ``<prefix><user>/`` of it.
    """

    bucket: s3.IBucket
    prefix: str


def parse_source_urls(name: str, value: object) -> tuple[str, ...]:
    """The ``resumeFrom`` setting: checkpoint URLs ``s3://bucket/checkpoints/<cluster id>/``,
    comma-separated (context) or a list; ConfigError naming the setting and the value."""
    items = value.split(",") if isinstance(value, str) else (
        list(value) if isinstance(value, list | tuple) else [value])
    urls = tuple(str(u).strip() for u in items if str(u).strip())
    for url in urls:
        found = _SOURCE_URL.match(url if url.endswith("/") else url + "/")
        if not found:
            raise ConfigError(
                f"{name} must list old clusters' checkpoint URLs like "
                f"s3://my-ckpt-bucket/checkpoints/old-cluster/ (the old stack's "
                f"CheckpointUrl output), got {url!r}")
        validation.bucket_name(name, found.group(1))
    normal = tuple(u if u.endswith("/") else u + "/" for u in urls)
    if len(set(normal)) != len(normal):
        raise ConfigError(f"{name} lists a checkpoint URL more than once, got {value!r}")
    if len(normal) > MAX_SOURCES:
        raise ConfigError(f"{name} may list at most {MAX_SOURCES} URLs, got {len(normal)}")
    return normal


#: a handful is plenty, and each adds three statements to the job role's policy
MAX_SOURCES = 10


def split_url(url: str) -> tuple[str, str]:
    """(bucket, prefix) of a URL :func:`parse_source_urls` accepted."""
    found = _SOURCE_URL.match(url)
    if not found:
        raise ConfigError(f"not a checkpoint URL: {url!r}")
    return found.group(1), found.group(2)


def grant_resume_read(role: iam.IRole, sources: Sequence[CheckpointSource], *,
                      user_tag: str) -> None:
    """Read access for ``role``'s sessions to their own user's part of each source."""
    for n, source in enumerate(sources):
        user_prefix = f"{source.prefix}${{aws:PrincipalTag/{user_tag}}}/"
        bucket = source.bucket
        role.add_to_principal_policy(iam.PolicyStatement(
            sid=f"ResumeRead{n}", actions=["s3:GetObject"],
            resources=[bucket.arn_for_objects(f"{user_prefix}*")]))
        role.add_to_principal_policy(iam.PolicyStatement(
            sid=f"ResumeRead{n}List", actions=["s3:ListBucket"], resources=[bucket.bucket_arn],
            conditions={"StringLike": {"s3:prefix": [f"{user_prefix}*"]}}))
        stack = Stack.of(role)
        role.add_to_principal_policy(iam.PolicyStatement(
            sid=f"ResumeRead{n}Decrypt", actions=["kms:Decrypt"],
            resources=[stack.format_arn(service="kms", resource="key", resource_name="*")],
            conditions={
                "StringEquals": {"kms:ViaService": f"s3.{stack.region}.amazonaws.com"},
                "StringLike": {"kms:EncryptionContext:aws:s3:arn": [
                    bucket.bucket_arn, bucket.arn_for_objects(f"{user_prefix}*")]},
            }))
