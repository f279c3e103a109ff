"""Drills: a user plants links and climbing labels in their own job files (F1, F13).

A job directory on EFS is its creator's: they can put anything in it, including a symbolic
link to someone else's file or a label that climbs out of it. The root services (the job
executor, the job controller) must never follow such a thing: a spec that is a link is
refused and nothing runs as its target's owner; a label with ``..`` is refused before any
file is opened; an attempt log that is a link is neither written nor made readable.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from bootstrap_scripts.jobs.cli.dl_run import build_parser, split_command
from bootstrap_scripts.jobs.cli.request_args import request_from_args
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.jobs import JobSpec, Proc, Share
from bootstrap_scripts.protocol.managed_records import ManagedJob, ManagedRequest
from bootstrap_scripts.protocol.paths import ClusterPaths
from bootstrap_scripts.protocol.records import ShareExit
from emulator.nodes import PYTHON
from tests.security.conftest import as_user, wait_until
from tests.security.opens import OpenWatch

pytestmark = [pytest.mark.slow]

#: a job command that leaves ``ran-as-<uid>`` in the directory it is given
MARKER = "import os, sys; open(f'{sys.argv[1]}/ran-as-{os.getuid()}', 'w').close()"

#: the attacker's side: make a job directory holding a link named spec.json
PLANT_LINK = """
import os, sys
job_dir, target = sys.argv[1], sys.argv[2]
os.mkdir(job_dir, 0o755)
os.symlink(target, os.path.join(job_dir, "spec.json"))
"""

#: the attacker's side: a job directory with a real spec of their own and a ``0-..``
#: directory that makes a label starting with ``../`` resolve out of nodes/
PLANT_CLIMB = """
import os, sys
job_dir, spec = sys.argv[1], sys.argv[2]
os.makedirs(os.path.join(job_dir, "nodes", "0-.."), 0o755)
fd = os.open(os.path.join(job_dir, "spec.json"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
os.write(fd, spec.encode())
os.close(fd)
"""

#: the attacker's side: a managed job whose attempt log is a link, its request written last
PLANT_MANAGED = """
import os, sys
job_dir, target, request = sys.argv[1], sys.argv[2], sys.argv[3]
os.makedirs(os.path.join(job_dir, "attempts"), 0o755)
os.symlink(target, os.path.join(job_dir, "attempts", "1.log"))
fd = os.open(os.path.join(job_dir, "request.json"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
os.write(fd, request.encode())
os.close(fd)
"""


def one_share_spec(job_id: str, address: str, argv: list[str], label: str = "") -> str:
    """A spec that runs ``argv`` on ``address`` (what ``dl-run`` would publish)."""
    return JobSpec(job_id=job_id, launcher="each",
                   shares=(Share(0, address, (Proc(argv=tuple(argv), label=label),)),),
                   created_at=time.time(), orphan_timeout=300).to_json()


@pytest.mark.parametrize("target_owner", ["victim", "root"])
def test_a_spec_linked_to_another_users_file_is_not_run_as_its_owner(
        cluster, victim, attacker, shared_tmp, target_owner):
    c = cluster
    address = c.membership.master_addr
    # Someone else's file that happens to be a valid spec (a copy of a job of theirs).
    target = shared_tmp / f"{target_owner}-spec.json"
    target.write_text(one_share_spec("evil-link", address, [PYTHON, "-c", MARKER,
                                                            str(shared_tmp)]))
    owner = victim.pw_uid if target_owner == "victim" else 0
    os.chown(target, owner, owner and victim.pw_gid)
    job = ClusterPaths(c.efs).job("evil-link", attacker.pw_name)

    planted = as_user(attacker, PLANT_LINK, str(job.dir), str(target))
    assert planted.returncode == 0, planted.stderr
    wait_until("the executor to look at the planted job",
               lambda: "evil-link" in c.executor_log(address))
    time.sleep(1.0)  # a share that started would have left its marker by now

    assert not job.started(0).exists(), c.executor_log(address)
    assert sorted(p.name for p in shared_tmp.glob("ran-as-*")) == [], \
        f"the planted spec ran as its target's owner:\n{c.executor_log(address)}"
    assert "symbolic link" in c.executor_log(address)


def test_a_label_that_climbs_out_of_the_job_directory_is_refused(cluster, victim, attacker):
    c = cluster
    address = c.membership.master_addr
    jobs = ClusterPaths(c.efs).jobs_dir
    made = as_user(victim, "import os, sys; os.mkdir(sys.argv[1], 0o755)",
                   str(jobs / victim.pw_name / "victim-job"))
    assert made.returncode == 0, made.stderr
    # nodes/0-../../../../../<victim>/victim-job/planted.log is the victim's job's planted.log
    spec = one_share_spec("evil-climb", address, [PYTHON, "-c", "print('planted')"],
                          label=f"../../../../../{victim.pw_name}/victim-job/planted")
    planted = as_user(attacker, PLANT_CLIMB, str(jobs / attacker.pw_name / "evil-climb"), spec)
    assert planted.returncode == 0, planted.stderr
    wait_until("the executor to look at the planted job",
               lambda: "evil-climb" in c.executor_log(address))
    time.sleep(1.0)

    assert sorted(p.name for p in (jobs / victim.pw_name / "victim-job").iterdir()) == [], \
        c.executor_log(address)
    assert not (jobs / attacker.pw_name / "evil-climb" / "nodes" / "0.started").exists()
    assert "invalid process label" in c.executor_log(address)


def test_a_linked_attempt_log_is_neither_chmodded_nor_written_as_root(
        cluster, victim, attacker):
    c = cluster
    secret = Path(victim.pw_dir) / "secret.txt"
    secret.write_text("the victim's secret\n")
    os.chown(secret, victim.pw_uid, victim.pw_gid)
    os.chmod(secret, 0o600)
    opts, command = split_command(["--launcher", "each", "--", PYTHON, "-c", "print(1)"])
    run = request_from_args(build_parser().parse_args(opts), command, "evil-log")
    request = ManagedRequest(job_id="evil-log", run=run, submitted_at=time.time(),
                             user=attacker.pw_name, world_size=1).to_json()
    paths = ClusterPaths(c.efs).managed("evil-log", attacker.pw_name)

    planted = as_user(attacker, PLANT_MANAGED, str(paths.dir), str(secret), request)
    assert planted.returncode == 0, planted.stderr

    def finished() -> bool:
        job = store.read_record_or_none(paths.record, ManagedJob)
        return job is not None and job.state in ("succeeded", "failed", "cancelled")

    wait_until("the controller to settle the planted job", finished, timeout=60)
    st = secret.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (victim.pw_uid, 0o600), c.controller_log()
    assert secret.read_text() == "the victim's secret\n"
    job = store.read_record(paths.record, ManagedJob)
    assert job.state == "failed" and "attempt's log" in job.message, job


#: the attacker's side: a job of their own whose log is a link to someone else's file
PLANT_LOG_LINK = """
import os, sys
job_dir, target, spec = sys.argv[1], sys.argv[2], sys.argv[3]
os.makedirs(os.path.join(job_dir, "nodes"), 0o755)
os.symlink(target, os.path.join(job_dir, "nodes", "0.log"))
fd = os.open(os.path.join(job_dir, "spec.json"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
os.write(fd, spec.encode())
os.close(fd)
"""


def test_a_share_log_linked_to_another_users_file_is_not_written(cluster, victim, attacker):
    c = cluster
    address = c.membership.master_addr
    notes = Path(victim.pw_dir) / "notes.txt"
    notes.write_text("the victim's notes\n")
    os.chown(notes, victim.pw_uid, victim.pw_gid)
    os.chmod(notes, 0o600)
    job = ClusterPaths(c.efs).job("evil-log-link", attacker.pw_name)
    spec = one_share_spec(job.job_id, address, [PYTHON, "-c", "print('overwritten')"])
    planted = as_user(attacker, PLANT_LOG_LINK, str(job.dir), str(notes), spec)
    assert planted.returncode == 0, planted.stderr
    wait_until("the executor to record the share", lambda: job.exit(0).exists())

    assert notes.read_text() == "the victim's notes\n", c.executor_log(address)
    assert stat.S_IMODE(notes.stat().st_mode) == 0o600
    assert "cannot open the share's log" in job.exit(0).read_text()


#: the attacker's side: a job of their own whose markers and records are links to a file
#: of root's, its spec (their own) written last; and a managed job whose request, record
#: and cancel marker are such links
PLANT_MARKERS = """
import os, sys
job_dir, managed_dir, target, spec = sys.argv[1:5]
os.makedirs(os.path.join(job_dir, "nodes"))
for name in ("done", "cancel", "runner.json", "result.json", "nodes/0.started",
             "nodes/0.exit"):
    os.symlink(target, os.path.join(job_dir, name))
os.makedirs(managed_dir)
for name in ("job.json", "cancel", "request.json"):
    os.symlink(target, os.path.join(managed_dir, name))
fd = os.open(os.path.join(job_dir, "spec.json"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
os.write(fd, spec.encode())
os.close(fd)
"""


def test_root_opens_no_link_planted_as_a_marker_or_record_and_writes_records_as_the_user(
        cluster, attacker, shared_tmp):
    c = cluster
    address = c.membership.master_addr
    target = shared_tmp / "root-only"
    target.write_text(ShareExit(rank=0, address=address, returncode=0).to_json())
    os.chmod(target, 0o600)  # root's, and a valid record: read through a link, it would count
    job = ClusterPaths(c.efs).job("evil-marks", attacker.pw_name)
    managed_job = ClusterPaths(c.efs).managed("evil-record", attacker.pw_name)
    spec = one_share_spec(job.job_id, address, [PYTHON, "-c", MARKER, str(shared_tmp)])
    watch = OpenWatch(target)
    try:
        planted = as_user(attacker, PLANT_MARKERS, str(job.dir), str(managed_job.dir),
                          str(target), spec)
        assert planted.returncode == 0, planted.stderr

        # links are no markers: the executor runs the job (as its user) and records its end
        ran = shared_tmp / f"ran-as-{attacker.pw_uid}"
        wait_until("the job to run as its user", ran.exists)
        wait_until("the share's exit record", lambda: not job.exit(0).is_symlink()
                   and job.exit(0).exists())

        # a request that is a link is refused, and its record is the user's file
        def recorded() -> bool:
            return not managed_job.record.is_symlink() and managed_job.record.exists()

        wait_until("the controller to record the refused request", recorded)
        time.sleep(1.0)  # a few more scans of both services
        opens = watch.opens()
    finally:
        watch.close()
    assert opens == 0, (f"a root service opened a file linked into a job directory {opens} "
                        f"time(s)\n{c.executor_log(address)}\n{c.controller_log()}")
    st = managed_job.record.lstat()
    assert st.st_uid == attacker.pw_uid, f"the record was written by uid {st.st_uid}"
    rec = ManagedJob.from_json(managed_job.record.read_text())
    assert rec.state == "failed" and "symbolic link" in rec.message, rec
