"""Drill: another user takes the victim's job id, or the victim's job directory, first.

Before, ``jobs/`` and ``managed/`` were mode 1777: every user created ``jobs/<job-id>/``
there, so anyone who saw a job id coming (a managed request names its attempts
``<id>.<n>``) could create that directory first and the victim's ``dl-run`` refused to
start ("already exists"): a denial of the victim's job. Now both are root's (0755) with one
directory per user in them, made by root (the job executors) and the user's: a job is
``jobs/<user>/<id>/``, nobody creates anything in another user's directory, and a user's
directory slot holding someone else's entry (left from the old layout) is refused, never
followed, by root and by the user's own ``dl-run``.
"""

from __future__ import annotations

import os
import secrets
import stat

import pytest

from tests.security.conftest import as_user, dl, wait_until
from tests.support.users import add_user, remove_user

pytestmark = [pytest.mark.slow]

#: the attacker's side: create each directory given (and a cancel marker in it), reporting
#: for each whether it could
TAKE = """
import errno, os, sys
for d in sys.argv[1:]:
    try:
        os.makedirs(d)
        with open(os.path.join(d, "cancel"), "w") as fh:
            fh.write("taken\\n")
        print("took", d)
    except OSError as exc:
        print("refused", d, errno.errorcode[exc.errno])
"""


def test_no_user_can_take_another_users_job_id_or_job_directory(cluster, victim, attacker):
    c = cluster
    jobs, managed = c.efs / "jobs", c.efs / "managed"
    # the attacker takes the victim's next job id wherever the victim's job may go (and in
    # their own directory, which is theirs to use)
    job_id = f"drill-{secrets.token_hex(3)}"
    targets = [jobs / job_id, managed / job_id, jobs / victim.pw_name / job_id,
               managed / victim.pw_name / job_id]
    took = as_user(attacker, TAKE, *map(str, targets), str(jobs / attacker.pw_name / job_id))
    assert took.returncode == 0, took.stderr

    # the victim's job of that id runs, in the victim's own directory, untouched
    rc, out = dl(c, victim, "dl-run", "--unmanaged", "--job-id", job_id, "--launcher", "each",
                 "--", "python", "-c", "print('the victim ran')")
    assert rc == 0 and "the victim ran" in out, out
    assert took.stdout.splitlines() == [f"refused {t} EACCES" for t in targets] + [
        f"took {jobs / attacker.pw_name / job_id}"], took.stdout
    mine = jobs / victim.pw_name / job_id
    assert mine.stat().st_uid == victim.pw_uid and not (mine / "cancel").exists()
    assert (jobs / attacker.pw_name / job_id / "cancel").read_text() == "taken\n"
    for top in (jobs, managed):  # root's; each user's own directory made by root, theirs
        st = top.stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o755)
        st = (top / victim.pw_name).stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (victim.pw_uid, 0o755)

    # a user's directory slot holding someone else's entry before root makes it (left from
    # the old 1777 layout): a link to the attacker's directory, a file of the attacker's
    late = f"dllate{secrets.token_hex(3)}"
    decoy = jobs / attacker.pw_name / "decoy"
    decoy.mkdir()
    os.chown(decoy, attacker.pw_uid, attacker.pw_gid)
    (jobs / late).symlink_to(decoy)
    os.lchown(jobs / late, attacker.pw_uid, attacker.pw_gid)
    (managed / late).write_text("not a directory\n")
    os.chown(managed / late, attacker.pw_uid, attacker.pw_gid)
    user = add_user(late, "--create-home", "--user-group", "--shell", "/bin/sh")
    try:
        # the executor saw the new account (its other directories are made)
        wait_until("checkpoints/<late>/", lambda: (c.efs / "checkpoints" / late).is_dir())
        assert (jobs / late).is_symlink() and (managed / late).is_file()
        st = decoy.stat()  # not handed to the new user through the link
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (attacker.pw_uid, 0o755)
        assert list(decoy.iterdir()) == []
        rc, out = dl(c, user, "dl-run", "--unmanaged", "--launcher", "each", "--", "true")
        assert rc == 2 and f"{jobs / late} is not your directory" in out, out
        assert list(decoy.iterdir()) == []
    finally:
        remove_user(late, "--remove")
