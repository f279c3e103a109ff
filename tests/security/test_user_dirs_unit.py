"""The per-user directories of ``jobs/``, ``managed/`` and ``checkpoints/``
(bootstrap_scripts/jobs/engine/user_dirs.py), without a cluster: who gets one, what root
lists, what a user's ``dl-run`` refuses. The drill with real users against the real
executor is tests/security/test_job_dirs.py."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from bootstrap_scripts.jobs.engine import user_dirs
from bootstrap_scripts.jobs.executor.daemon import prepare_shared_dirs
from bootstrap_scripts.protocol.paths import own_user

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")


def test_the_login_range_comes_from_login_defs(tmp_path: Path) -> None:
    defs = tmp_path / "login.defs"
    defs.write_text("# comment\nUID_MIN\t\t 2000\nUID_MAX 2999\nGID_MIN 5\n")
    assert user_dirs.uid_range(defs) == (2000, 2999)
    assert user_dirs.uid_range(tmp_path / "missing") == user_dirs.DEFAULT_UID_RANGE
    users = user_dirs.login_users(defs)
    assert users["root"] == (0, 0)  # root always; system accounts (daemon, nobody) never
    assert all(uid == 0 or 2000 <= uid <= 2999 for uid, _gid in users.values())
    assert "daemon" not in users and "nobody" not in users


def test_root_lists_only_directories_named_after_their_owner(tmp_path: Path) -> None:
    me = own_user()
    (tmp_path / me).mkdir()
    (tmp_path / "train-1").mkdir()            # the old flat layout: a job, not a user
    (tmp_path / "nosuchuser0x").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / me)
    assert [u for u, _d in user_dirs.user_dirs(tmp_path)] == [me]
    assert list(user_dirs.user_dirs(tmp_path / "missing")) == []


@ROOT_ONLY
def test_a_directory_named_after_a_user_but_not_theirs_is_not_listed(tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()
    os.chown(tmp_path / "root", 12345, 12345)  # someone else's, under root's name
    assert list(user_dirs.user_dirs(tmp_path)) == []


@ROOT_ONLY
def test_the_executor_makes_each_users_directory_and_refuses_a_planted_one(
        tmp_path: Path) -> None:
    efs = tmp_path / "efs"
    efs.mkdir()
    for name in ("jobs", "managed"):  # an older cluster's 1777 trees
        (efs / name).mkdir(mode=0o1777)
        os.chmod(efs / name, 0o1777)
    target = tmp_path / "target"
    target.mkdir()
    os.chown(target, 12345, 12345)
    (efs / "jobs" / "root").symlink_to(target)  # planted in root's slot
    os.lchown(efs / "jobs" / "root", 12345, 12345)
    assert {"jobs", "managed"} <= {p.name for p in prepare_shared_dirs(efs)}  # 1777 no more
    refused = user_dirs.ensure(efs, {"root": (0, 0), "daemon": (1, 1)})
    assert [line.split(":")[0] for line in refused] == ["jobs/root"]
    assert (efs / "jobs" / "root").is_symlink() and os.stat(target).st_uid == 12345
    for name in ("jobs", "managed", "checkpoints"):
        st = (efs / name).stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o755)
    st = (efs / "managed" / "daemon").stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (1, 0o755)
    st = (efs / "checkpoints" / "daemon").stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (1, 0o700)
    with pytest.raises(user_dirs.UserDirError, match="is not your directory"):
        user_dirs.own_dir(efs / "jobs")  # root's own dl-run: not through the link
    assert user_dirs.own_dir(efs / "managed") == efs / "managed" / "root"


def test_the_keeper_reads_the_accounts_only_when_they_change(tmp_path: Path) -> None:
    passwd = tmp_path / "passwd"
    passwd.write_text("x\n")
    keeper = user_dirs.Keeper(tmp_path / "efs", passwd=passwd)
    (tmp_path / "efs").mkdir()
    assert keeper.tick(now=0.0) is True and own_user() in keeper.users
    assert keeper.tick(now=1.0) is False
    os.utime(passwd, ns=(1, 1))
    assert keeper.tick(now=2.0) is True


def test_dl_run_without_its_directory_says_what_makes_it(tmp_path: Path,
                                                          monkeypatch) -> None:
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    theirs = os.stat_result((0o40755, 0, 0, 0, 99999, 0, 0, 0, 0, 0))  # root's, say
    monkeypatch.setattr(os, "lstat", lambda p, _real=os.lstat: (
        _real(p) if Path(p) != jobs else theirs))
    with pytest.raises(user_dirs.UserDirError, match=r"the job executors \(root\) make"):
        user_dirs.own_dir(jobs, wait=0.0)


@ROOT_ONLY
def test_a_bare_id_is_the_callers_own_job_first_and_never_a_guess(tmp_path: Path) -> None:
    """Two users' jobs of one id: a bare id is the caller's own; for anyone else it is
    ambiguous, and the error names both keys; ``USER/ID`` names one."""
    from bootstrap_scripts.jobs.engine import managed
    from bootstrap_scripts.protocol.paths import ClusterPaths

    cluster = ClusterPaths(tmp_path)
    for user, uid in (("root", 0), ("daemon", 1)):
        paths = cluster.managed("train", user)
        paths.dir.mkdir(parents=True)
        paths.request.write_text("{}")
        os.chown(paths.dir.parent, uid, uid)
    assert managed.find(tmp_path, "train") == cluster.managed("train", "root")
    assert managed.find(tmp_path, "train", mine="daemon").key == "daemon/train"
    with pytest.raises(managed.ManagedError, match="several users' jobs: name one of "
                                                   "daemon/train, root/train"):
        managed.find(tmp_path, "train", mine="bin")
    assert managed.find(tmp_path, "daemon/train", mine="bin").key == "daemon/train"
    with pytest.raises(managed.ManagedError, match="no job 'bin/train'"):
        managed.find(tmp_path, "bin/train")
