"""dl-run --data's stager (bootstrap_scripts/data/stage.py) against moto's S3 server over
HTTP: what it copies, what it skips, how it resumes, and how it fails (before any job)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import boto3
import pytest

from bootstrap_scripts.data import disks
from bootstrap_scripts.data.plan import StageError
from tests.conftest import REPO_ROOT
from tests.data.conftest import S3Env, put_raw, run_stage


def staged_files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*")
            if p.is_file() and ".dl-stage" not in p.parts}


def test_stages_the_prefix_to_the_root_volume_and_a_second_run_copies_nothing(s3env) -> None:
    objects = {f"digits/part-{i:02d}/x.bin": os.urandom(1000 + i) for i in range(12)}
    for key, body in objects.items():
        s3env.put(key, body)
    s3env.put("digits-private/secret.bin", b"not under digits/")
    first = run_stage(s3env, "s3://training-data/digits")
    user = __import__("pwd").getpwuid(os.geteuid()).pw_name
    expected_dir = s3env.root / "var/tmp" / f"dl-data-{user}" / "training-data" / "digits"
    assert first["directory"] == str(expected_dir)
    assert staged_files(expected_dir) == {k.removeprefix("digits/"): v
                                          for k, v in objects.items()}
    assert (first["objects"], first["copied"]) == (12, 12)
    manifest = json.loads((expected_dir / ".dl-stage/manifest.json").read_text())
    assert set(manifest["objects"]) == set(objects)
    assert (os.stat(expected_dir.parent.parent).st_mode & 0o777) == 0o700

    second = run_stage(s3env, "s3://training-data/digits/")
    assert (second["objects"], second["copied"], second["copied_bytes"]) == (12, 0, 0)

    # same size, new content: the ETag differs, so that object (only) is copied again
    key = "digits/part-03/x.bin"
    changed = os.urandom(len(objects[key]))
    s3env.put(key, changed)
    third = run_stage(s3env, "s3://training-data/digits")
    assert third["copied"] == 1
    assert (expected_dir / "part-03/x.bin").read_bytes() == changed


def test_an_explicit_directory_and_shards_split_the_objects(s3env, tmp_path) -> None:
    for i in range(10):
        s3env.put(f"ds/{i}.bin", bytes([i]) * 10)
    seen: list[str] = []
    for rank in range(3):
        out = tmp_path / f"shard{rank}"
        result = run_stage(s3env, f"s3://training-data/ds:{out}", rank=rank, shard_count=3)
        assert result["directory"] == str(out) and result["shard"] == f"{rank}/3"
        seen += staged_files(out)
    assert sorted(seen) == sorted(f"{i}.bin" for i in range(10)), "each object exactly once"


def test_a_missing_bucket_names_the_bucket(s3env) -> None:
    with pytest.raises(StageError, match=r"s3://no-such-bucket: the bucket does not exist "
                                         r"\(NoSuchBucket\)"):
        run_stage(s3env, "s3://no-such-bucket/ds")


def test_an_empty_prefix_is_an_error_not_an_empty_dataset(s3env) -> None:
    with pytest.raises(StageError, match="s3://training-data/nothing/: no objects to stage"):
        run_stage(s3env, "s3://training-data/nothing")


def test_the_region_comes_from_the_nodes_region_file_not_the_environment(s3env, monkeypatch
                                                                           ) -> None:
    s3env.put("ds/a", b"a")
    os.unlink(s3env.root / "etc/dl-cluster/aws-region.env")
    monkeypatch.setenv("AWS_REGION", "us-east-1")  # what a job's environment might carry
    with pytest.raises(StageError, match=r"no AWS region in .*etc/dl-cluster/aws-region\.env"):
        run_stage(s3env, "s3://training-data/ds")


def test_a_key_that_would_escape_the_directory_is_refused(s3env, tmp_path) -> None:
    s3env.put("ds/ok", b"x")
    s3env.put("ds/../../etc/evil", b"x")
    with pytest.raises(StageError, match=r"'ds/\.\./\.\./etc/evil' has an empty, '\.' or "
                                         r"'\.\.' part"):
        run_stage(s3env, f"s3://training-data/ds:{tmp_path / 'out'}")
    assert not (tmp_path / "etc").exists()


def test_a_planted_symlink_as_the_users_data_directory_is_refused(s3env, tmp_path) -> None:
    s3env.put("ds/a", b"a")
    user = __import__("pwd").getpwuid(os.geteuid()).pw_name
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (s3env.root / "var/tmp" / f"dl-data-{user}").symlink_to(elsewhere)
    with pytest.raises(StageError, match="is not a directory of this user"):
        run_stage(s3env, "s3://training-data/ds")
    assert not list(elsewhere.iterdir())


@pytest.fixture()
def moto_auth(s3env: S3Env):
    """moto's IAM enforcement on (``/moto-api/reset-auth``), and back off afterwards: a user
    whose policy allows reading ``allowed/`` of the bucket only, as the node role's does
    for the stack's dataPrefix; ``secret/`` and ``allowed/`` hold an object each."""
    iam = boto3.client("iam", endpoint_url=s3env.endpoint, region_name="us-east-1")
    iam.create_user(UserName="node")
    bucket_arn = f"arn:aws:s3:::{s3env.bucket}"
    iam.put_user_policy(UserName="node", PolicyName="read-allowed", PolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [
            {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": bucket_arn,
             "Condition": {"StringLike": {"s3:prefix": ["allowed/*"]}}},
            {"Effect": "Allow", "Action": "s3:GetObject",
             "Resource": f"{bucket_arn}/allowed/*"}]}))
    key = iam.create_access_key(UserName="node")["AccessKey"]
    client = boto3.client("s3", endpoint_url=s3env.endpoint, region_name="us-east-1",
                          aws_access_key_id=key["AccessKeyId"],
                          aws_secret_access_key=key["SecretAccessKey"], aws_session_token="")

    def reset_auth(count: str) -> None:
        urllib.request.urlopen(urllib.request.Request(
            f"{s3env.endpoint}/moto-api/reset-auth", data=count.encode(), method="POST",
            headers={"Content-Type": "text/plain"}),
            timeout=10).read()

    s3env.put("secret/weights.bin", b"x")
    s3env.put("allowed/a.bin", b"abc")
    reset_auth("0")  # from here on, every request is checked against IAM
    try:
        yield client
    finally:
        reset_auth("inf")


def test_a_denied_prefix_fails_naming_the_prefix_and_the_cause(s3env, moto_auth) -> None:
    with pytest.raises(StageError, match=r"s3://training-data/secret/.*access denied"):
        run_stage(s3env, "s3://training-data/secret", client=moto_auth)
    # the allowed prefix works with the same credentials
    assert run_stage(s3env, "s3://training-data/allowed", client=moto_auth)["copied"] == 1


def stage_process(env: S3Env, source: str, *args: str, rank: int = 0) -> subprocess.Popen:
    """The stager as every node's executor starts it (its rank in ``DL_NODE_RANK``)."""
    return subprocess.Popen(
        [sys.executable, "-m", "bootstrap_scripts.data.stage", source, *args], cwd=REPO_ROOT,
        env={**os.environ, "DL_ROOT": str(env.root), "AWS_ENDPOINT_URL": env.endpoint,
             "DL_NODE_RANK": str(rank)},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def test_every_node_stages_everything_unless_sharded(s3env, tmp_path) -> None:
    """Node rank 1 of 2 (what the executor says) stages the whole prefix without
    --shard-count, and its half with --shard-count 2."""
    for i in range(4):
        s3env.put(f"ds/{i}.bin", b"x")
    for args, expected in (((), 4), (("--shard-count", "2"), 2)):
        out = tmp_path / f"out{len(args)}"
        proc = stage_process(s3env, f"s3://training-data/ds:{out}", *args, rank=1)
        text, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, text
        assert len(staged_files(out)) == expected, text
        assert f'"objects": {expected}' in text


def test_the_stager_process_refuses_an_unchecked_object_with_checksums_required(
        s3env, tmp_path) -> None:
    """``--checksums required`` (what ``dl-run --data-checksums required`` gives every
    node's stager): exit 1 and the error line naming the object, before any job."""
    s3env.put("ds/checked.bin", b"a CRC32 object")
    put_raw(s3env, "ds/old.bin", b"stored with no checksum", None)
    out = tmp_path / "out"
    proc = stage_process(s3env, f"s3://training-data/ds:{out}", "--checksums", "required")
    text, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, text
    assert ("error: s3://training-data/ds/old.bin: refused by --data-checksums required, "
            "its bytes could not be checked against S3's checksum: it is an object with no "
            "checksum in S3") in text
    assert not (out / "old.bin").exists()


def test_a_killed_copy_resumes_without_copying_what_it_completed(s3env, tmp_path) -> None:
    bodies = {f"big/{i:03d}.bin": os.urandom(256 * 1024) for i in range(120)}
    for key, body in bodies.items():
        s3env.put(key, body)
    out = tmp_path / "out"
    proc = stage_process(s3env, f"s3://training-data/big:{out}", "--concurrency", "1")
    journal = out / ".dl-stage/journal"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            if journal.exists() and len(journal.read_text().splitlines()) >= 10:
                break
            time.sleep(0.02)
        assert proc.poll() is None, "the copy ended before it could be killed"
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert not (out / ".dl-stage/manifest.json").exists(), "a killed copy is not complete"
    done = len(journal.read_text().splitlines())
    assert 10 <= done < len(bodies)

    result = run_stage(s3env, f"s3://training-data/big:{out}")
    assert result["copied"] <= len(bodies) - done + 1  # the journal may lag one object
    assert result["copied"] < len(bodies)
    assert staged_files(out) == {k.removeprefix("big/"): v for k, v in bodies.items()}
    assert not [p for p in out.rglob("*") if ".dl-part" in p.name]


@pytest.fixture()
def tiny_disk(tmp_path: Path):
    """A 2 MiB tmpfs (root only: mounting needs it); unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    mount = tmp_path / "tiny"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_too_little_space_fails_before_copying_anything(s3env, tiny_disk) -> None:
    s3env.put("ds/a.bin", os.urandom(1024 * 1024))
    with pytest.raises(StageError, match=r"tiny/data: not enough space for 1 object\(s\): "
                                         r"needs 1\.0 MB \(\+256 MiB headroom\), \d\.\d MB free"):
        run_stage(s3env, f"s3://training-data/ds:{tiny_disk}/data")
    assert staged_files(tiny_disk / "data") == {}


def test_a_disk_that_fills_while_copying_names_the_object(s3env, tiny_disk, monkeypatch) -> None:
    # past the space check (as when something else fills the disk meanwhile)
    monkeypatch.setattr(disks, "check_space", lambda *a: None)
    for i in range(3):
        s3env.put(f"ds/{i}.bin", os.urandom(1024 * 1024))
    with pytest.raises(StageError, match=r"s3://training-data/ds/\d\.bin: cannot write \d\.bin: "
                                         r"No space left on device"):
        run_stage(s3env, f"s3://training-data/ds:{tiny_disk}/data")
    assert not (tiny_disk / "data/.dl-stage/manifest.json").exists()
    assert not [p for p in tiny_disk.rglob("*") if ".dl-part" in p.name]


@pytest.mark.skipif(os.geteuid() != 0, reason="creating a user needs root (CI runs as root)")
def test_staging_as_the_jobs_user_leaves_files_that_user_owns(s3env) -> None:
    """What every node's executor does for dl-run --data: the stager runs with the job
    user's uid (the share's), so the copy and its directory are that user's, not root's."""
    import shutil
    import tempfile

    from emulator.nodes import PYTHON
    from tests.conftest import REPO_ROOT as repo
    from tests.data.conftest import node_root
    from tests.support.users import cluster_user, reachable

    s3env.put("ds/a.bin", b"abc")
    s3env.put("ds/sub/b.bin", b"defg")
    top = Path(tempfile.mkdtemp(prefix="dl-stage-user-"))
    os.chmod(top, 0o755)
    try:
        root = node_root(top / "node")
        with cluster_user() as user, reachable(os.path.realpath(PYTHON), PYTHON, repo):
            proc = subprocess.run(
                [PYTHON, "-m", "bootstrap_scripts.data.stage", "s3://training-data/ds"],
                cwd="/", env={**os.environ, "DL_ROOT": str(root), "PYTHONPATH": repo,
                              "AWS_ENDPOINT_URL": s3env.endpoint, "HOME": user.pw_dir},
                user=user.pw_uid, group=user.pw_gid, extra_groups=[], capture_output=True,
                text=True, timeout=120)
            assert proc.returncode == 0, proc.stdout + proc.stderr
            mine = root / "var/tmp" / f"dl-data-{user.pw_name}"
            staged = [mine, *mine.rglob("*")]
            assert {p.relative_to(mine).as_posix() for p in staged if p.is_file()} >= {
                "training-data/ds/a.bin", "training-data/ds/sub/b.bin"}
            assert all(p.stat().st_uid == user.pw_uid for p in staged), [
                (p, p.stat().st_uid) for p in staged if p.stat().st_uid != user.pw_uid]
            assert (mine.stat().st_mode & 0o777) == 0o700
    finally:
        shutil.rmtree(top, ignore_errors=True)
