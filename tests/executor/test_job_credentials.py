"""A job's own AWS credentials (``executor/job_credentials.py``): the job role's, assumed by
the executor, written only for the job's user, found by the SDK through AWS_CONFIG_FILE,
renewed before they expire, and never the node's own."""

from __future__ import annotations

import json
import os
import stat
from datetime import UTC, datetime

import boto3
import botocore.session
import pytest
from moto import mock_aws

from bootstrap_scripts.jobs.executor.job_credentials import (
    REFRESH_BEFORE_SECONDS,
    USER_TAG,
    CredentialsError,
    JobCredentialStore,
    job_env,
    session_name,
)

REGION = "us-east-1"
TRUST = json.dumps({"Version": "2012-10-17", "Statement": [{
    "Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::123456789012:root"},
    "Action": ["sts:AssumeRole", "sts:TagSession"]}]})


@pytest.fixture()
def role_arn():
    with mock_aws():
        iam = boto3.client("iam", region_name=REGION)
        yield iam.create_role(RoleName="dl-job", AssumeRolePolicyDocument=TRUST)["Role"]["Arn"]


class RecordingSts:
    """moto's STS, remembering what the executor asked for."""

    def __init__(self) -> None:
        self.client = boto3.client("sts", region_name=REGION)
        self.calls: list[dict] = []

    def assume_role(self, **kwargs):
        self.calls.append(kwargs)
        return self.client.assume_role(**kwargs)


def test_a_job_gets_the_job_roles_credentials_for_its_user_only(tmp_path, role_arn):
    sts = RecordingSts()
    store = JobCredentialStore(tmp_path / "job-credentials", role_arn, REGION, lambda: sts)
    creds = store.issue("train-1", "alice", 4242, 4343)
    (call,) = sts.calls
    assert call["RoleArn"] == role_arn and call["Tags"] == [{"Key": USER_TAG, "Value": "alice"}]
    assert call["RoleSessionName"] == "dl-alice-train-1"
    for d in (store.base, creds.directory):
        st = os.lstat(d)
        assert st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o711
    for f in (creds.credentials_file, creds.config_file):
        st = os.lstat(f)
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (4242, 4343, 0o600)
    # The SDK, given only the job's environment, finds them (credential_process) and the
    # region, and none of the node's.
    env = job_env({"AWS_ACCESS_KEY_ID": "NODE", "AWS_SECRET_ACCESS_KEY": "node-secret",
                   "AWS_PROFILE": "node", "PATH": "/usr/bin"}, creds)
    assert "AWS_ACCESS_KEY_ID" not in env and "AWS_PROFILE" not in env
    assert env["AWS_EC2_METADATA_DISABLED"] == "true" and env["PATH"] == "/usr/bin"
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("AWS_")}
    try:
        os.environ.update({k: v for k, v in env.items() if k.startswith("AWS_")})
        session = botocore.session.Session()
        found = session.get_credentials().get_frozen_credentials()
        assert session.get_config_variable("region") == REGION
    finally:
        for k in [k for k in os.environ if k.startswith("AWS_")]:
            del os.environ[k]
        os.environ.update(saved)
    written = json.loads(creds.credentials_file.read_text())
    assert found.access_key == written["AccessKeyId"] != "NODE"
    assert found.token == written["SessionToken"]


def test_credentials_are_renewed_before_they_expire_and_removed_with_the_job(tmp_path,
                                                                            role_arn):
    sts = RecordingSts()
    now = [datetime.now(UTC).timestamp()]
    store = JobCredentialStore(tmp_path / "jc", role_arn, REGION, lambda: sts,
                               clock=lambda: now[0])
    creds = store.issue("j", "bob", os.getuid(), os.getgid())
    owners = {"j": ("bob", os.getuid(), os.getgid())}
    assert store.refresh_due(owners) == [] and len(sts.calls) == 1  # plenty left
    now[0] = creds.expiration - REFRESH_BEFORE_SECONDS + 1
    assert store.refresh_due(owners) == []  # the call is started on its thread
    store.calls.calls["j"].done.wait(30)
    assert store.refresh_due(owners) == [] and len(sts.calls) == 2  # its answer written
    store.forget("j")
    assert not creds.directory.exists() and "j" not in store.jobs


def test_sts_refusal_names_the_role_and_the_job(tmp_path):
    class Refusing:
        def assume_role(self, **_kwargs):
            raise RuntimeError("AccessDenied: not authorized to perform sts:AssumeRole")

    store = JobCredentialStore(tmp_path / "jc", "arn:aws:iam::1:role/dl-job", REGION,
                               lambda: Refusing())
    with pytest.raises(CredentialsError, match=r"job role arn:aws:iam::1:role/dl-job for job "
                                               r"j7 failed: AccessDenied"):
        store.issue("j7", "carol", os.getuid(), os.getgid())
    assert not (tmp_path / "jc" / "j7").exists()


def test_a_planted_link_is_never_followed(tmp_path, role_arn):
    """The base directory is root's; if something else stands at a job's place, refuse."""
    store = JobCredentialStore(tmp_path / "jc", role_arn, REGION, lambda: RecordingSts())
    store.base.mkdir(mode=0o711)
    target = tmp_path / "elsewhere"
    target.mkdir()
    (store.base / "j").symlink_to(target)
    with pytest.raises(CredentialsError, match="is not a directory"):
        store.issue("j", "mallory", os.getuid(), os.getgid())
    assert list(target.iterdir()) == []
    with pytest.raises(CredentialsError, match="cannot name"):
        store.issue("../etc", "mallory", os.getuid(), os.getgid())


def test_no_job_role_means_no_credentials_and_still_none_of_the_nodes(tmp_path):
    store = JobCredentialStore(tmp_path / "jc", "", REGION, lambda: None)
    assert not store.enabled and store.issue("j", "u", 1, 1) is None
    env = job_env({"AWS_SESSION_TOKEN": "node"}, None)
    assert env == {"AWS_EC2_METADATA_DISABLED": "true"}


def test_session_names_fit_sts():
    assert session_name("a b", "x" * 100) == ("dl-a-b-" + "x" * 100)[:64]
    assert len(session_name("u", "j")) <= 64


def test_a_job_that_stays_the_executors_user_is_tagged_with_that_users_name(tmp_path,
                                                                            role_arn):
    """uid -1 (root's own job: the share stays who the executor is) tags the session with
    the executor's user name, the one dl-run writes into the job's checkpoint URL, not "-1"
    (with IAM enforced, a "-1" tag made the job's own checkpoint prefix AccessDenied)."""
    import pwd

    from bootstrap_scripts.jobs.executor.shares import Shares

    sts = RecordingSts()
    shares = Shares.__new__(Shares)  # only its credentials are used here
    shares.credentials = JobCredentialStore(tmp_path / "job-credentials", role_arn, REGION,
                                            lambda: sts)
    owner = Shares.owner_of(-1, -1)
    shares.credentials.begin("train-1", *owner)
    shares.credentials.calls.calls["train-1"].done.wait(30)
    assert shares.credentials.settled("train-1")
    creds, _owner = shares.issue_credentials("train-1", -1, -1)
    assert creds is not None and creds.credentials_file.exists()
    me = pwd.getpwuid(os.geteuid()).pw_name
    assert sts.calls[0]["Tags"] == [{"Key": USER_TAG, "Value": me}]
    assert owner == (me, -1, -1)
