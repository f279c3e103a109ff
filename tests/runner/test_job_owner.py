"""Jobs run as the user who submitted them, not as the executors' root (a real user).

The executors run as root on every node (as on a real cluster); ``dl-run`` runs as a user
created for the test. The job's processes must carry that user's uid on every node, the
files they write on EFS must belong to it, and a job root submits still runs as root.
CI runs as root, so this runs there; it is skipped only where users cannot be created.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootstrap_scripts.jobs.executor.daemon import (
    PER_USER_EFS_DIRS,
    PER_USER_PARENT_MODE,
)
from bootstrap_scripts.protocol.paths import ClusterPaths, JobPaths
from tests.support import users
from tests.support.cluster import LocalCluster, free_rdzv_port
from tests.support.users import run_as

# the shared fixtures (tests/support/users.py), by name
job_user = users.job_user
reachable_python = users.reachable_python

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="creating a user needs root")]
WHOAMI = Path(__file__).parent / "jobs" / "whoami.py"
WHOAMI_RE = re.compile(r"^\[(\d) \S+\] whoami node=\d uid=(\d+) euid=(\d+) gid=(\d+)", re.M)


@pytest.fixture()
def cluster(job_user, reachable_python) -> Iterator[LocalCluster]:
    """Two emulated nodes whose executors run as root, in a directory every user can
    reach (pytest's own temporary directory is private to root)."""
    with users.cluster_for_users("dl-owner-", 2) as c:
        c.start_executors()
        yield c


def test_a_users_job_runs_as_that_user_on_every_node(cluster, job_user):
    c = cluster
    for name in PER_USER_EFS_DIRS:  # root's; only root makes entries (one per user)
        st = (c.efs / name).stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, PER_USER_PARENT_MODE), name
    rc, out = run_as(c, job_user, "--rdzv-port", free_rdzv_port(c), "--",
                     "python", str(WHOAMI))
    assert rc == 0, out
    ranks = {m.group(1): m.groups()[1:] for m in WHOAMI_RE.finditer(out)}
    uid, gid = str(job_user.pw_uid), str(job_user.pw_gid)
    assert ranks == {"0": (uid, uid, gid), "1": (uid, uid, gid)}, out
    (jdir,) = c.job_dirs()
    assert JobPaths(jdir).spec.stat().st_uid == job_user.pw_uid
    mine = c.efs / "checkpoints" / job_user.pw_name  # made by root, handed to the user
    st = mine.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (
        job_user.pw_uid, job_user.pw_gid, 0o700)
    written = sorted((mine / jdir.name).iterdir())
    assert [p.name for p in written] == ["node0.txt", "node1.txt"]
    for path in [written[0].parent, *written]:
        st = path.stat()
        assert (st.st_uid, st.st_gid) == (job_user.pw_uid, job_user.pw_gid), path


def test_a_job_root_submits_runs_as_root(cluster):
    c = cluster
    res = c.run("--launcher", "each", "--", "python", str(WHOAMI))
    assert res.returncode == 0, res.stdout
    ranks = {m.group(1): m.groups()[1:] for m in WHOAMI_RE.finditer(res.stdout)}
    assert ranks == {"0": ("0", "0", "0"), "1": ("0", "0", "0")}, res.stdout


def test_a_users_managed_job_runs_as_that_user_through_the_root_controller(cluster, job_user):
    """The controller runs as root; the attempt it starts for a user's job is that user's:
    the attempt's spec belongs to the user and every rank runs with the user's uid/gid."""
    c = cluster
    c.start_controller()
    rc, out = run_as(c, job_user, "--launcher", "each", "--", "python", str(WHOAMI),
                     managed=True)
    assert rc == 0, out + c.controller_log()
    ranks = {m.group(1): m.groups()[1:] for m in WHOAMI_RE.finditer(out)}
    uid, gid = str(job_user.pw_uid), str(job_user.pw_gid)
    assert ranks == {"0": (uid, uid, gid), "1": (uid, uid, gid)}, out
    (jdir,) = c.job_dirs()
    assert jdir.name.endswith(".1")  # attempt 1 of the managed job
    assert JobPaths(jdir).spec.stat().st_uid == job_user.pw_uid
    assert jdir.parent.name == job_user.pw_name  # in the user's own jobs/<user>/
    managed_dir = ClusterPaths(c.efs).managed(jdir.name.removesuffix(".1"), job_user.pw_name)
    assert managed_dir.request.stat().st_uid == job_user.pw_uid
    st = (c.efs / "managed").stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, PER_USER_PARENT_MODE)
    st = managed_dir.dir.parent.stat()  # made by root, the user's
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (job_user.pw_uid, 0o755)
