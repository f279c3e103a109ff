"""The rules root-run code follows in a user's files (``jobs/engine/userfiles.py``) and the
spec's words that name files (labels, addresses), checked without a cluster."""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

from bootstrap_scripts.jobs.engine import userfiles
from bootstrap_scripts.protocol.errors import ProtocolError
from bootstrap_scripts.protocol.jobs import JobSpec, JobSpecError
from bootstrap_scripts.protocol.paths import JobPaths

NOBODY = 65534


def spec_text(**share: object) -> str:
    proc = {"argv": ["true"], "label": share.pop("label", "")}
    return json.dumps({"job_id": "j-1", "launcher": "each",
                       "shares": [{"rank": 0, "address": "10.0.0.1", "procs": [proc],
                                   **share}]})


@pytest.mark.parametrize("label", ["../x", "a/b", "..", ".hidden", "x" * 33, "a b"])
def test_a_label_that_is_not_a_word_is_refused(label):
    with pytest.raises(JobSpecError, match="label"):
        JobSpec.from_json(spec_text(label=label))


@pytest.mark.parametrize("share", [{"address": "../../x"}, {"address": "a/b"},
                                   {"rank": -1}, {"rank": True}, {"rank": "0"}])
def test_an_address_or_rank_that_could_name_another_file_is_refused(share):
    with pytest.raises(JobSpecError):
        JobSpec.from_json(spec_text(**share))


def test_words_that_are_fine_pass():
    spec = JobSpec.from_json(spec_text(label="rdzv-store"))
    assert spec.shares[0].procs[0].label == "rdzv-store"
    with pytest.raises(ProtocolError):
        JobPaths(__import__("pathlib").Path("/efs/jobs/j-1")).log(0, "../x")


def test_read_owned_refuses_a_link_and_reads_the_owners_file(tmp_path):
    (tmp_path / "real.json").write_text("{}")
    (tmp_path / "spec.json").symlink_to(tmp_path / "real.json")
    with pytest.raises(userfiles.UnsafeUserFile, match="symbolic link"):
        userfiles.read_owned(tmp_path, "spec.json")
    owned = userfiles.read_owned(tmp_path, "real.json")
    assert (owned.text, owned.uid) == ("{}", os.geteuid())
    with pytest.raises(userfiles.UnsafeUserFile):
        userfiles.read_owned(tmp_path, "../real.json")
    link_dir = tmp_path.parent / f"{tmp_path.name}-link"
    link_dir.symlink_to(tmp_path)
    with pytest.raises(userfiles.UnsafeUserFile, match="symbolic link"):
        userfiles.read_owned(link_dir, "real.json")


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file away needs root")
def test_read_owned_refuses_a_file_not_its_directory_owners(tmp_path):
    (tmp_path / "spec.json").write_text("{}")
    os.chown(tmp_path / "spec.json", NOBODY, NOBODY)
    with pytest.raises(userfiles.UnsafeUserFile, match="belongs to uid"):
        userfiles.read_owned(tmp_path, "spec.json")


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
def test_as_user_writes_with_the_users_rights_and_comes_back(shared_tmp):
    tmp_path = shared_tmp / "root-only"  # the user may traverse it, not write in it
    tmp_path.mkdir(mode=0o755)
    with userfiles.as_user(NOBODY, NOBODY), pytest.raises(PermissionError):
        (tmp_path / "x").write_text("no")
    assert os.geteuid() == 0 and os.getegid() == 0
    mine = tmp_path / "mine"
    mine.mkdir()
    os.chown(mine, NOBODY, NOBODY)
    with userfiles.as_user(NOBODY, NOBODY):
        os.close(userfiles.open_append(mine / "log"))
    st = (mine / "log").stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (NOBODY, 0o644)


@pytest.mark.skipif(os.geteuid() != 0, reason="handing a directory over needs root")
def test_user_dir_is_made_by_root_and_handed_to_the_user(tmp_path):
    parent = tmp_path / "checkpoints"
    parent.mkdir(mode=0o755)
    made = userfiles.user_dir(parent, NOBODY, NOBODY)
    st = made.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (NOBODY, NOBODY, 0o700)
    assert userfiles.user_dir(parent, NOBODY, NOBODY) == made  # again: the same, unchanged
    os.chmod(parent, 0o777)  # a parent others may write in: nothing made there
    with pytest.raises(userfiles.UnsafeUserFile, match="writable by nobody else"):
        userfiles.user_dir(parent, NOBODY, NOBODY)


def test_a_fifo_planted_as_a_record_does_not_block_a_reader(tmp_path):
    """A root daemon polls records in users' job directories: a FIFO there (no writer)
    is refused at once (no regular file), not hang the daemon for every user."""
    from bootstrap_scripts.protocol import store

    os.mkfifo(tmp_path / "cancel")
    assert store.exists(tmp_path / "cancel")
    with pytest.raises(store.NotARecordFile):
        store.read_text(tmp_path / "cancel")
    assert store.stamp(tmp_path / "cancel") is not None


@pytest.fixture()
def job_dir(tmp_path):
    """``jobs/`` as on EFS (everyone may create in it, sticky) and one job directory."""
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    os.chmod(jobs, 0o1777)
    (jobs / "j-1" / "nodes").mkdir(parents=True)
    return jobs / "j-1"


def exit_record(rank: int = 0) -> str:
    from bootstrap_scripts.protocol.records import ShareExit
    return ShareExit(rank=rank, address="10.0.0.1", returncode=0).to_json()


def test_a_marker_or_record_that_is_a_link_is_not_there_for_root(job_dir, tmp_path):
    from bootstrap_scripts.protocol.records import ShareExit
    target = tmp_path / "elsewhere.json"
    target.write_text(exit_record())
    (job_dir / "done").symlink_to(target)
    (job_dir / "nodes" / "0.exit").symlink_to(target)
    (job_dir / "nodes" / "1.exit").write_text(exit_record(1))
    os.mkfifo(job_dir / "nodes" / "2.exit")

    assert not userfiles.exists(job_dir / "done")
    assert not userfiles.exists(job_dir / "cancel")
    assert userfiles.exists(job_dir / "nodes" / "1.exit")
    assert userfiles.read_record_or_none(job_dir / "nodes" / "0.exit", ShareExit) is None
    with pytest.raises(userfiles.UnsafeUserFile, match="symbolic link"):
        userfiles.read_record(job_dir / "nodes" / "0.exit", ShareExit)
    assert userfiles.read_record(job_dir / "nodes" / "9.exit", ShareExit) is None
    assert [stem for stem, _ in userfiles.scan(job_dir / "nodes", ShareExit,
                                               suffix=".exit")] == ["1"]
    assert userfiles.read_from(job_dir / "nodes" / "0.exit", 0) is None
    assert userfiles.read_from(job_dir / "nodes" / "1.exit", 2) == exit_record(1).encode()[2:]


def test_a_job_directory_that_is_a_link_leads_nowhere(job_dir, tmp_path):
    from bootstrap_scripts.protocol.records import ShareExit
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "nodes").mkdir(parents=True)
    (elsewhere / "nodes" / "0.exit").write_text(exit_record())
    (elsewhere / "done").write_text("")
    linked = job_dir.parent / "j-linked"
    linked.symlink_to(elsewhere)  # in the world-writable jobs/: anyone could have made it

    assert not userfiles.exists(linked / "done")
    assert list(userfiles.scan(linked / "nodes", ShareExit, suffix=".exit")) == []
    with pytest.raises(userfiles.UnsafeUserFile, match="symbolic link"):
        userfiles.open_dir(linked / "nodes")
    # a link above the last component, in a directory only root (this user) may write in,
    # is the administrator's (a mount point, say): followed
    trusted = tmp_path / "trusted-link"
    trusted.symlink_to(elsewhere)
    assert [s for s, _ in userfiles.scan(trusted / "nodes", ShareExit, suffix=".exit")] == ["0"]


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another owner needs root")
def test_a_file_not_its_directory_owners_is_no_marker_or_record(job_dir):
    from bootstrap_scripts.protocol.records import ShareExit
    (job_dir / "cancel").write_text("")
    (job_dir / "nodes" / "0.exit").write_text(exit_record())
    os.chown(job_dir / "cancel", NOBODY, NOBODY)
    os.chown(job_dir / "nodes" / "0.exit", NOBODY, NOBODY)
    assert not userfiles.exists(job_dir / "cancel")
    assert userfiles.read_record_or_none(job_dir / "nodes" / "0.exit", ShareExit) is None


def test_atomic_write_replaces_a_link_without_reading_through_it(job_dir, tmp_path):
    from bootstrap_scripts.protocol import store
    target = tmp_path / "target"
    target.write_text("same")
    os.chmod(target, 0o000)
    (job_dir / "job.json").symlink_to(target)
    os.mkfifo(job_dir / "fifo")
    assert store.atomic_write(job_dir / "job.json", "same")  # written, not "already so"
    assert not (job_dir / "job.json").is_symlink()
    assert (job_dir / "job.json").read_text() == "same" and target.read_text() == "same"
    assert store.atomic_write(job_dir / "fifo", "")  # a FIFO never blocks nor holds ""
    assert not store.atomic_write(job_dir / "job.json", "same")


@pytest.mark.skipif(os.geteuid() != 0, reason="giving files to users needs root")
def test_a_marker_or_job_record_root_wrote_before_an_upgrade_still_counts(job_dir):
    from bootstrap_scripts.jobs.engine import managed
    from bootstrap_scripts.protocol.managed_records import ManagedJob
    from bootstrap_scripts.protocol.paths import ManagedPaths
    os.chown(job_dir, NOBODY, NOBODY)  # the user's job directory; root's files in it
    (job_dir / "cancel").write_text("")
    (job_dir / "job.json").write_text(ManagedJob(job_id="j-1", state="failed").to_json())
    assert userfiles.exists(job_dir / "cancel")
    assert managed.load_job(ManagedPaths(job_dir)).state == "failed"
    with pytest.raises(userfiles.UnsafeUserFile, match="belongs to uid 0"):
        userfiles.read_owned(job_dir, "job.json")  # a spec or request: only the user's


def test_a_user_walks_to_their_job_directory_through_directories_they_may_only_search(
        tmp_path: Path) -> None:
    """Root writes a job's records as its user (``as_owner_of``): the walk from ``/`` must
    need no more than a path would, search permission (``--x``) on the directories above."""
    from tests.support.users import add_user, remove_user

    if os.geteuid() != 0:
        pytest.skip("switching to another user needs root")
    name = "dlwalk" + os.urandom(3).hex()
    user = add_user(name, "--no-create-home", "--user-group")
    try:
        top = Path(tempfile.mkdtemp(prefix="dl-walk-", dir="/tmp"))
        os.chmod(top, 0o711)  # searchable, not readable, by others (like a kept demo's)
        job = top / "efs" / "jobs" / "j1"
        job.mkdir(parents=True)
        os.chmod(top / "efs", 0o755)
        os.chmod(top / "efs" / "jobs", 0o1777)
        os.chown(job, user.pw_uid, user.pw_gid)
        try:
            with userfiles.as_owner_of(job):
                fd = userfiles.open_dir(job)
                os.close(fd)
                (job / "marker").write_text("x")
            assert (job / "marker").stat().st_uid == user.pw_uid
        finally:
            shutil.rmtree(top, ignore_errors=True)
    finally:
        remove_user(name)
