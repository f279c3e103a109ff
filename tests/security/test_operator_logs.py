"""Drill: a cluster user links their job's logs to root's files, then has an operator's
``dl-jobs logs`` (which the per-user Command document runs as root) print them.

A finished job's directories are their user's: the user may replace a node log, the
attempt's runner log or its spec with a link at any time. ``dl-jobs logs`` run by root must
print only what the user's own files hold: a real user plants the links, root runs
``dl-jobs logs`` as the operator document does, and root's secret must not appear. No
cluster: the files are all there is to it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootstrap_scripts.jobs.cli import dl_jobs
from bootstrap_scripts.jobs.engine import user_dirs
from bootstrap_scripts.protocol.jobs import JobSpec, Proc, Share
from bootstrap_scripts.protocol.managed_records import ManagedRequest
from bootstrap_scripts.protocol.run_request import RunRequest
from tests.security.conftest import as_user

SECRET = "root:$6$not-for-users$secret-line"

#: the attacker's side: a managed job of theirs whose attempt 1 has one real log line and
#: links, to root's file, in place of another node's log, the runner's log, and nothing
#: more (the spec is their own, as dl-run wrote it)
PLANT = """
import os, pwd, sys
efs, job_id, target, request, spec = sys.argv[1:6]
me = pwd.getpwuid(os.getuid()).pw_name  # the user's own directories, made by root
job = os.path.join(efs, "managed", me, job_id)
os.makedirs(os.path.join(job, "attempts"))
os.symlink(target, os.path.join(job, "attempts", "1.log"))
attempt = os.path.join(efs, "jobs", me, job_id + ".1")
os.makedirs(os.path.join(attempt, "nodes"))
with open(os.path.join(attempt, "spec.json"), "w") as fh:
    fh.write(spec)
with open(os.path.join(attempt, "nodes", "0.log"), "w") as fh:
    fh.write("the attacker's own line\\n")
os.symlink(target, os.path.join(attempt, "nodes", "1.log"))
with open(os.path.join(job, "request.json"), "w") as fh:
    fh.write(request)
"""


@pytest.fixture()
def efs() -> Iterator[Path]:
    """The shared file system's top directories as the executors make them (``jobs/`` and
    ``managed/`` root's), somewhere every user can reach."""
    top = Path(tempfile.mkdtemp(prefix="dl-logs-"))
    os.chmod(top, 0o755)
    for name in ("jobs", "managed"):
        (top / name).mkdir(mode=0o755)
    try:
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_an_operators_dl_jobs_never_prints_a_file_linked_as_a_jobs_log(
        efs, attacker, reachable_python, monkeypatch, capsys):
    secret = efs / "root-only"
    secret.write_text(SECRET + "\n")
    os.chmod(secret, 0o600)
    job_id = "evil-logs"
    request = ManagedRequest(job_id=job_id, run=RunRequest(job_id=job_id, command=("true",)),
                             submitted_at=time.time(), user=attacker.pw_name).to_json()
    spec = JobSpec(job_id=f"{job_id}.1", launcher="each", created_at=time.time(),
                   shares=(Share(0, "10.0.0.1", (Proc(argv=("true",)),)),
                           Share(1, "10.0.0.2", (Proc(argv=("true",)),)))).to_json()
    user_dirs.ensure(efs, {attacker.pw_name: (attacker.pw_uid, attacker.pw_gid)})
    planted = as_user(attacker, PLANT, str(efs), job_id, str(secret), request, spec)
    assert planted.returncode == 0, planted.stderr

    # what the operator's per-user document runs, as root
    monkeypatch.setenv(dl_jobs.OPERATOR_USER_ENV, attacker.pw_name)
    code = dl_jobs.main(["--mount-point", str(efs), "logs", job_id])
    out, err = capsys.readouterr()

    assert code == 0, err
    assert "[0 10.0.0.1] the attacker's own line" in out  # the job's own log is printed
    assert SECRET not in out + err, "dl-jobs (root) printed a file linked in as a log"
