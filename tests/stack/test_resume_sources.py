"""Resuming in a new cluster from an old one's checkpoints (constructs_lib/resume_sources.py):
the ``resumeFrom`` setting gives the job role read access to each user's own part of an old
cluster's checkpoints, decryption only through S3 for that bucket, and nothing more."""

from __future__ import annotations

import json

import pytest
from aws_cdk.assertions import Template

from constructs_lib.resume_sources import parse_source_urls, split_url
from constructs_lib.validation import ConfigError
from tests.stack.synth import cluster_template
from tests.support.iam_statements import s3_statements

OLD = "s3://old-ckpts/checkpoints/old-cluster/"


@pytest.fixture(scope="module")
def template() -> Template:
    return cluster_template(resumeFrom=OLD)


def test_jobs_read_only_their_users_part_of_an_old_clusters_checkpoints(
        template: Template) -> None:
    by_sid = {s["Sid"]: s for s in s3_statements(template, "JobRole")}
    read, listing, decrypt = (by_sid[f"ResumeRead0{x}"] for x in ("", "List", "Decrypt"))
    assert read["Action"] == ["s3:GetObject"]  # no write, no delete: the old one is kept
    assert ':s3:::old-ckpts/checkpoints/old-cluster/${aws:PrincipalTag/dl-user}/*"' in \
        read["Resource"]
    assert listing["Action"] == ["s3:ListBucket"]
    assert ':s3:::old-ckpts"' in listing["Resource"]
    assert listing["Condition"] == {"StringLike": {"s3:prefix": [
        "checkpoints/old-cluster/${aws:PrincipalTag/dl-user}/*"]}}
    assert decrypt["Action"] == ["kms:Decrypt"]
    condition = json.dumps(decrypt["Condition"])
    assert '"kms:ViaService"' in condition and "s3." in condition
    context = decrypt["Condition"]["StringLike"]["kms:EncryptionContext:aws:s3:arn"]
    assert len(context) == 2 and all("old-ckpts" in json.dumps(c) for c in context)
    assert all("${aws:PrincipalTag/dl-user}" in json.dumps(c) or json.dumps(c).endswith(
        ':s3:::old-ckpts"]]}') for c in context)
    # this cluster's own grants stay as they were
    assert "ReadWriteCheckpoints" in by_sid and len(by_sid) == 6, sorted(map(str, by_sid))


def test_without_resume_from_the_job_role_reads_no_other_bucket() -> None:
    sids = {s["Sid"] for s in s3_statements(cluster_template(), "JobRole")}
    assert not {s for s in sids if s and s.startswith("ResumeRead")}


def test_the_stack_prints_its_checkpoint_url_for_the_next_cluster(template: Template) -> None:
    output = template.to_json()["Outputs"]["CheckpointUrl"]
    assert "/checkpoints/DLClusterStack/" in json.dumps(output["Value"])
    assert "resumeFrom" in output["Description"]


@pytest.mark.parametrize("value", [
    "old-ckpts/checkpoints/c/",                  # not a URL
    "s3://old-ckpts/checkpoints/",                # no cluster id
    "s3://old-ckpts/checkpoints/*/",              # a wildcard would widen the grant
    "s3://old-ckpts/checkpoints/c/alice/",        # one user's part: the user comes from the tag
    "s3://old-ckpts/data/c/",                     # not a checkpoint prefix
    "s3://Old_Bucket/checkpoints/c/",             # not a bucket name
    f"{OLD},{OLD}",                               # twice
    ",".join(f"s3://b{n:02d}x/checkpoints/c/" for n in range(11)),  # too many
])
def test_a_bad_resume_from_names_the_setting_and_the_value(value: str) -> None:
    with pytest.raises(ConfigError, match="resumeFrom"):
        parse_source_urls("'resumeFrom'", value)


def test_urls_are_normalized_and_split() -> None:
    urls = parse_source_urls("'resumeFrom'", "s3://a-b/checkpoints/c1 , s3://c.d/checkpoints/x_2/")
    assert urls == ("s3://a-b/checkpoints/c1/", "s3://c.d/checkpoints/x_2/")
    assert split_url(urls[0]) == ("a-b", "checkpoints/c1/")


def test_cdk_refuses_a_bad_resume_from_at_synth() -> None:
    with pytest.raises(ConfigError, match=r"resumeFrom.*s3://x/"):
        cluster_template(resumeFrom="s3://x/")


def test_parliament_finds_nothing_unexplained_in_the_grants(template: Template) -> None:
    from tests.stack.iam_lint import unexplained

    left, _used = unexplained(template.to_json())
    assert not left, "\n".join(left)
