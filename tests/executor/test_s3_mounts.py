"""``dl-run --mount`` on a node (``executor/s3_mounts.py``): the exact mount-s3 command line,
its credentials (the job's, never the node's), the checks root makes on the user's directory,
and a node without mount-s3 failing the share clearly. No FUSE here: mount-s3 itself is not
run (docs/emulator.md); a stand-in records what the executor handed it."""

from __future__ import annotations

import errno
import json
import os
import stat
import sys
from pathlib import Path

import pytest

from bootstrap_scripts.jobs.executor.job_credentials import JobCredentials
from bootstrap_scripts.jobs.executor.s3_mounts import (
    MNT_DETACH,
    UMOUNT_NOFOLLOW,
    MountError,
    S3Mounts,
    mount_argv,
    mount_env,
    pin_directory,
    unmount_path,
)
from bootstrap_scripts.protocol.data_source import (
    DataSource,
    DataSourceError,
    check_mounts,
    parse_mount_source,
)
from bootstrap_scripts.protocol.jobs import JobSpec, JobSpecError, Proc, Share
from bootstrap_scripts.protocol.paths import JobPaths
from bootstrap_scripts.protocol.run_request import RunRequest


def test_the_mount_command_line_is_read_only_for_the_jobs_user_only():
    source = parse_mount_source("s3://my-datasets/imagenet/train:/home/alice/imagenet")
    assert mount_argv(source, "/proc/self/fd/7", uid=1001, gid=1002, region="eu-west-1") == [
        "mount-s3", "my-datasets", "/proc/self/fd/7", "--read-only", "--foreground",
        "--allow-other", "--uid", "1001", "--gid", "1002", "--dir-mode", "0500",
        "--file-mode", "0400", "--prefix", "imagenet/train/", "--region", "eu-west-1"]
    whole = parse_mount_source("s3://my-datasets:/data/x")
    assert mount_argv(whole, "/t", uid=5, gid=6, region="", cache_dir="/opt/dlami/nvme/c") == [
        "mount-s3", "my-datasets", "/t", "--read-only", "--foreground", "--allow-other",
        "--uid", "5", "--gid", "6", "--dir-mode", "0500", "--file-mode", "0400",
        "--cache", "/opt/dlami/nvme/c"]


def test_mount_s3_gets_the_jobs_credentials_and_none_of_the_nodes(tmp_path):
    creds = JobCredentials(tmp_path / "j", 0.0)
    env = mount_env({"AWS_ACCESS_KEY_ID": "NODE", "AWS_SECRET_ACCESS_KEY": "s",
                     "AWS_SESSION_TOKEN": "t", "AWS_PROFILE": "node",
                     "AWS_CONFIG_FILE": "/root/.aws/config", "PATH": "/usr/bin"}, creds)
    assert env == {"PATH": "/usr/bin", "AWS_CONFIG_FILE": str(creds.mount_config_file),
                   "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
                   "AWS_EC2_METADATA_DISABLED": "true"}


@pytest.mark.parametrize("text, why", [
    ("s3://my-datasets/x", "an absolute directory"),
    ("s3://my-datasets/x:/etc/dl", "system directory /etc"),
    ("s3://my-datasets/x:/usr", "system directory /usr"),
    ("s3://my-datasets/x:/opt", "system directory /opt/deeplearning"),  # above one
    ("s3://my-datasets/x:/", "an absolute directory"),
    ("s3://my-datasets/x:/home/a/../../etc", "s3://bucket/prefix"),
    ("s3://My_Bucket/x:/home/a/d", "not an S3 bucket name"),
    ("s3://my-datasets/a//b:/home/a/d", "empty or '..' part"),
])
def test_a_bad_mount_is_refused_naming_it(text, why):
    with pytest.raises(DataSourceError, match="--mount") as err:
        parse_mount_source(text)
    assert why in str(err.value)


def test_overlapping_or_too_many_mounts_are_refused():
    assert check_mounts(("s3://b-1/x:/home/a/x", "s3://b-1/y:/home/a/y")) == (
        DataSource("b-1", "x/", "/home/a/x"), DataSource("b-1", "y/", "/home/a/y"))
    with pytest.raises(DataSourceError, match="overlap"):
        check_mounts(("s3://b-1/x:/home/a/x", "s3://b-1/y:/home/a/x/y"))
    with pytest.raises(DataSourceError, match="at most 8"):
        check_mounts(tuple(f"s3://b-1/x:/home/a/{i}" for i in range(9)))


def test_the_mounts_travel_in_the_request_and_the_spec():
    request = RunRequest(job_id="j1", command=("true",), mounts=("s3://b-1/x:/home/a/x",))
    assert RunRequest.from_json(request.to_json()).mounts == ("s3://b-1/x:/home/a/x",)
    with pytest.raises(DataSourceError):
        RunRequest(job_id="j1", command=("true",), mounts=("s3://b-1/x:/etc",))
    spec = JobSpec(job_id="j1", launcher="each", mounts=("s3://b-1/x:/home/a/x",), shares=(
        Share(rank=0, address="10.0.0.1", procs=(Proc(argv=("true",)),)),))
    assert JobSpec.from_json(spec.to_json()).mounts == spec.mounts
    bad = json.loads(spec.to_json())
    bad["mounts"] = ["s3://b-1/x:/root/x"]  # the spec is the user's file: checked again
    with pytest.raises(JobSpecError, match="/root"):
        JobSpec.from_json(json.dumps(bad))


def test_root_mounts_only_on_a_directory_of_the_user_reached_without_links(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    pinned = pin_directory(str(mine), os.getuid(), os.getgid())
    try:
        assert os.path.samestat(os.fstat(pinned.dir_fd), os.stat(mine))
        assert os.path.samestat(os.fstat(pinned.parent_fd), os.stat(tmp_path))
        assert unmount_path(pinned.parent_fd, pinned.name) == \
            f"/proc/self/fd/{pinned.parent_fd}/mine"
    finally:
        pinned.close()
    (tmp_path / "link").symlink_to(mine)
    with pytest.raises(MountError, match="symbolic link"):
        pin_directory(str(tmp_path / "link"), os.getuid(), os.getgid())
    with pytest.raises(MountError, match="symbolic link"):  # a link on the way, not last
        pin_directory(str(tmp_path / "link" / "x"), os.getuid(), os.getgid())
    with pytest.raises(MountError, match="create it first"):
        pin_directory(str(tmp_path / "missing"), os.getuid(), os.getgid())
    # Another user's directory: as root, one given away to another uid; as a user (the
    # ids are not switched then), a job user this process is not.
    if os.geteuid() == 0:
        os.chown(mine, 4242, 4242)
        job_uid, owner = 0, 4242
    else:
        job_uid, owner = os.getuid() + 4242, os.getuid()
    with pytest.raises(MountError, match=f"belongs to uid {owner}, not to the job's user "
                                         f"\\(uid {job_uid}\\)"):
        pin_directory(str(mine), job_uid, os.getgid())


@pytest.fixture()
def job(tmp_path):
    paths = JobPaths(tmp_path / "efs" / "jobs" / "j1")
    paths.nodes.mkdir(parents=True)
    target = tmp_path / "data"
    target.mkdir()
    creds = JobCredentials(tmp_path / "creds", 0.0)
    return paths, target, creds


def test_a_node_without_mount_s3_fails_the_share_saying_so(tmp_path, job):
    paths, target, creds = job
    empty = tmp_path / "bin"
    empty.mkdir()
    mounts = S3Mounts(region="us-east-1")
    with pytest.raises(MountError, match="mount-s3 is not available on this node"):
        mounts.mount("j1", [f"s3://b-1/x:{target}"], 0, paths, os.getuid(), os.getgid(), creds,
                     {"PATH": str(empty)})
    assert mounts.jobs == {}


def fake_mount_s3(bindir: Path, record: Path, code: int) -> None:
    """A stand-in mount-s3: records its arguments, what its target names and its
    credentials setting, then exits ``code`` without mounting (nothing here can)."""
    bindir.mkdir(exist_ok=True)
    script = bindir / "mount-s3"
    script.write_text(
        f"#!{sys.executable}\nimport os, sys\n"
        f"with open({str(record)!r}, 'w') as f:\n"
        f"    print(' '.join(sys.argv[1:]), os.readlink(sys.argv[2]),\n"
        f"          os.environ.get('AWS_CONFIG_FILE'),\n"
        f"          os.environ.get('AWS_ACCESS_KEY_ID', 'none'), sep='\\n', file=f)\n"
        f"sys.exit({code})\n")
    script.chmod(0o755)


def test_mount_s3_is_given_the_checked_directory_itself_and_a_failure_is_named(tmp_path, job):
    paths, target, creds = job
    fake_mount_s3(tmp_path / "bin", tmp_path / "record", code=3)
    mounts = S3Mounts(region="us-east-1")
    with pytest.raises(MountError, match=r"mount-s3 exited with code 3 \(its output: 0-mount.0"):
        mounts.mount("j1", [f"s3://b-1/x/:{target}"], 0, paths, os.getuid(), os.getgid(),
                     creds, {"PATH": str(tmp_path / "bin"), "AWS_ACCESS_KEY_ID": "NODE"})
    argv, points_at, config, key = (tmp_path / "record").read_text().splitlines()
    assert argv.startswith("b-1 /proc/self/fd/") and " --prefix x/ --region us-east-1" in argv
    assert points_at == str(target)  # the inode root checked, whatever the name says now
    assert config == str(creds.mount_config_file) and key == "none"
    log = paths.log(0, "mount.0")
    assert "dl-executor: mount-s3 b-1 /proc/self/fd/" in log.read_text()
    assert mounts.jobs == {}


def test_no_job_role_means_no_mount(tmp_path, job):
    paths, target, _creds = job
    fake_mount_s3(tmp_path / "bin", tmp_path / "record", code=0)
    with pytest.raises(MountError, match="the node's are never used"):
        S3Mounts().mount("j1", [f"s3://b-1/x:{target}"], 0, paths, os.getuid(), os.getgid(),
                         None, {"PATH": str(tmp_path / "bin")})
    assert not (tmp_path / "record").exists()


def test_the_unmount_names_the_mount_through_the_pinned_parent_without_links(tmp_path):
    calls = []
    mounts = S3Mounts(umount2=lambda path, flags: calls.append((path, flags)) or 0)
    target = tmp_path / "d"
    target.mkdir()
    pinned = pin_directory(str(target), os.getuid(), os.getgid())

    class Done:
        returncode = 0

        def wait(self, timeout=None):
            return 0

    from bootstrap_scripts.jobs.executor.s3_mounts import Mounted
    mounts.jobs["j1"] = [Mounted(pinned, Done())]  # type: ignore[arg-type]
    parent = pinned.parent_fd
    mounts.release("j1")
    assert calls == [(f"/proc/self/fd/{parent}/d", MNT_DETACH | UMOUNT_NOFOLLOW)]
    assert mounts.jobs == {}
    with pytest.raises(OSError):
        os.fstat(parent)  # closed with the mount


def test_the_mount_credentials_are_roots_alone(tmp_path):
    from bootstrap_scripts.jobs.executor.job_credentials import JobCredentialStore

    class Sts:
        def assume_role(self, **kwargs):
            return {"Credentials": {"AccessKeyId": "AKIA", "SecretAccessKey": "s",
                                    "SessionToken": "t", "Expiration": "2030-01-01T00:00:00Z"}}

    store = JobCredentialStore(tmp_path / "jc", "arn:aws:iam::1:role/j", "us-east-1", Sts)
    creds = store.issue("j1", "alice", os.getuid(), os.getgid())
    for f in (creds.mount_credentials_file, creds.mount_config_file):
        st = os.lstat(f)
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (os.geteuid(), 0o600)
    assert str(creds.mount_credentials_file) in creds.mount_config_file.read_text()
    assert json.loads(creds.mount_credentials_file.read_text())["AccessKeyId"] == "AKIA"


def test_umount2_is_called_for_real_and_refuses_a_plain_directory(tmp_path):
    from bootstrap_scripts.jobs.executor.s3_mounts import _umount2

    # root: not a mount point (EINVAL); a user: not allowed (EPERM). Never 0, never a crash.
    assert _umount2(str(tmp_path), MNT_DETACH | UMOUNT_NOFOLLOW) in (errno.EINVAL, errno.EPERM)


def test_a_job_never_gets_a_second_set_of_mounts_on_a_node(tmp_path, job):
    paths, target, creds = job
    fake_mount_s3(tmp_path / "bin", tmp_path / "record", code=0)
    mounts = S3Mounts()
    mounts.jobs["j1"] = []
    with pytest.raises(MountError, match="has its mounts on this node already"):
        mounts.mount("j1", [f"s3://b-1/x:{target}"], 0, paths, os.getuid(), os.getgid(), creds,
                     {"PATH": str(tmp_path / "bin")})
    assert mounts.jobs == {"j1": []} and not (tmp_path / "record").exists()


# -- the executor: a share with --mount on a node that cannot mount ---------------------------

SHARE_ADDRESS = "127.20.250.7"


def test_the_executor_fails_the_share_before_the_job_runs_naming_the_cause(
        tmp_path, monkeypatch):
    """The executor (in this process, one pass at a time, as tests/executor/test_enospc.py
    runs it) on a node without mount-s3: the job's command never runs, its exit record and
    its log say why."""
    import time

    from bootstrap_scripts.jobs.executor.daemon import Executor
    from bootstrap_scripts.protocol import store
    from bootstrap_scripts.protocol.records import RunnerHeartbeat, ShareExit

    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", f"{empty}{os.pathsep}{os.path.dirname(sys.executable)}")
    (tmp_path / "efs").mkdir()
    ex = Executor(tmp_path / "node", tmp_path / "efs", SHARE_ADDRESS)
    try:
        ex.step()
        paths = ex.node.cluster.job("mounted")
        ran = tmp_path / "ran"
        store.write_record(paths.runner_heartbeat, RunnerHeartbeat(seq=1, time=time.time()))
        spec = JobSpec(job_id="mounted", launcher="each", mounts=(
            f"s3://b-1/x:{tmp_path / 'data'}",), shares=(Share(0, SHARE_ADDRESS, (
                Proc(argv=(sys.executable, "-c", f"open({str(ran)!r}, 'w')")),)),))
        store.atomic_write(paths.spec, spec.to_json())
        deadline = time.monotonic() + 20
        while not store.exists(paths.exit(0)):
            assert time.monotonic() < deadline, "the share's exit was never recorded"
            ex.step()
            time.sleep(0.05)
        record = store.read_record(paths.exit(0), ShareExit)
        assert record is not None and record.returncode == 127
        assert "mount-s3 is not available on this node" in record.reason
        assert "dl-executor: mount-s3 is not available" in paths.log(0).read_text()
        assert not ran.exists() and ex.shares.mounts.jobs == {}
    finally:
        ex.shares.stop_all("test over")
