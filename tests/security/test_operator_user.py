"""An operator's per-user Command document cancels only its own user's jobs (F12, held by
docs/security.md's operator line): the document runs ``dl-jobs`` as root with
``DL_OPERATOR_USER=<its user>`` (constructs_lib/operator_document.py), and ``dl-jobs cancel``
then refuses a job whose ``request.json`` is another user's file, whatever the request says
of itself. Real users (``useradd``), real files; no cluster."""

from __future__ import annotations

import os
import pwd
import time
from pathlib import Path

import pytest

from bootstrap_scripts.jobs.cli import dl_jobs
from bootstrap_scripts.jobs.engine import user_dirs
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.managed_records import ManagedRequest
from bootstrap_scripts.protocol.paths import ClusterPaths
from bootstrap_scripts.protocol.run_request import RunRequest
from tests.support.users import CAN_CREATE_USERS, cluster_user, reachable

pytestmark = pytest.mark.skipif(not CAN_CREATE_USERS, reason="creating users needs root")


def submitted_by(efs: Path, job_id: str, owner: pwd.struct_passwd, *, claims: str) -> Path:
    """A queued job as ``owner``'s dl-run leaves it (its directory and request are the
    owner's files); the request's own ``user`` field says ``claims``."""
    (efs / "managed").mkdir(exist_ok=True)
    user_dirs.ensure(efs, {owner.pw_name: (owner.pw_uid, owner.pw_gid)})  # as the executors
    req = ManagedRequest(job_id=job_id, run=RunRequest(job_id=job_id, command=("true",)),
                         submitted_at=time.time(), user=claims)
    paths = ClusterPaths(efs).managed(job_id, owner.pw_name)
    paths.dir.mkdir()
    store.write_record(paths.request, req, mode=store.OWNER_ONLY)
    for path in (paths.dir, paths.request):
        os.chown(path, owner.pw_uid, owner.pw_gid)
    return paths.cancel


def cancel(efs: Path, job_id: str, monkeypatch, operator_user: str | None) -> int:
    if operator_user is None:
        monkeypatch.delenv(dl_jobs.OPERATOR_USER_ENV, raising=False)
    else:
        monkeypatch.setenv(dl_jobs.OPERATOR_USER_ENV, operator_user)
    return dl_jobs.main(["--mount-point", str(efs), "cancel", job_id])


def test_a_users_document_cannot_cancel_another_users_job(tmp_path, monkeypatch,
                                                          capsys) -> None:
    efs = tmp_path / "efs"
    efs.mkdir()
    # root writes the marker as the job's user, who must reach it (as on EFS)
    with cluster_user() as alice, cluster_user() as bob, reachable(efs / "managed"):
        bobs = submitted_by(efs, "j-bob", bob, claims=alice.pw_name)  # a request that lies
        alices = submitted_by(efs, "j-alice", alice, claims=alice.pw_name)
        capsys.readouterr()
        assert cancel(efs, "j-bob", monkeypatch, alice.pw_name) == dl_jobs.EXIT_USAGE
        err = capsys.readouterr().err
        assert f"job j-bob is {bob.pw_name}'s, not {alice.pw_name}'s" in err, err
        assert not store.exists(bobs)  # nothing was cancelled
        assert cancel(efs, "j-alice", monkeypatch, alice.pw_name) == 0
        assert store.exists(alices)
        assert alices.stat().st_uid == alice.pw_uid  # the user's marker, not root's
        # the any-user document (the admin policy's) sets nothing: root cancels any job
        assert cancel(efs, "j-bob", monkeypatch, None) == 0
        assert store.exists(bobs)


def test_a_request_planted_as_a_link_is_not_taken_as_the_users(tmp_path, monkeypatch,
                                                               capsys) -> None:
    efs = tmp_path / "efs"
    efs.mkdir()
    with cluster_user() as alice, cluster_user() as bob:
        submitted_by(efs, "j-alice", alice, claims=alice.pw_name)
        submitted_by(efs, "j-bob", bob, claims=bob.pw_name)
        request = ClusterPaths(efs).managed("j-bob", bob.pw_name).request
        request.unlink()  # bob's directory, a link to alice's request
        request.symlink_to(ClusterPaths(efs).managed("j-alice", alice.pw_name).request)
        os.chown(request, bob.pw_uid, bob.pw_gid, follow_symlinks=False)
        capsys.readouterr()
        assert cancel(efs, "j-bob", monkeypatch, alice.pw_name) == dl_jobs.EXIT_USAGE
        assert "symbolic link" in capsys.readouterr().err
        assert not store.exists(request.parent / "cancel")
