"""Drill: a value given to ``dl-run --env`` is never on a command line while the job runs.

Every user of a node can read every process's ``/proc/<pid>/cmdline``. A REAL
unprivileged user (the victim) passes three values the three ways ``dl-run`` takes them:
``--env KEY=VALUE`` on its command line (dl-run moves it off as it starts), ``--env KEY``
(from dl-run's own environment) and ``--env-file FILE``; unmanaged and managed (the root
job controller's attempt). From the moment the job's share runs until it ends, every
process of the machine is looked at (``tests/support/proc_watch.py``): none, dl-run and the
job's processes included, may hold a value on its command line; the job still gets all
three in its environment.
"""

from __future__ import annotations

import os
import secrets

import pytest

from tests.security.conftest import dl
from tests.support.proc_watch import ProcWatch, watching

pytestmark = [pytest.mark.slow]

#: The job: say it runs (the watch is armed from then on), show the variables it was
#: given, live long enough to be looked at.
JOB = ": > {started}; tr '\\0' '\\n' < /proc/$$/environ | grep '^DL_DRILL_'; sleep 3"


def test_env_values_are_on_no_command_line_while_the_job_runs(cluster, victim, shared_tmp):
    c = cluster
    tag = f"s3cret{secrets.token_hex(8)}"
    env_file = shared_tmp / "job.env"
    env_file.write_text(f"# the job's secrets\nDL_DRILL_FILE={tag}-file\n")
    os.chown(env_file, victim.pw_uid, victim.pw_gid)
    env_file.chmod(0o600)
    for managed in (False, True):
        started = shared_tmp / f"started-{managed}"
        args = [*(() if managed else ("--unmanaged",)), "--launcher", "each",
                "--env", f"DL_DRILL_ARGV={tag}-argv", "--env", "DL_DRILL_ENV",
                "--env-file", str(env_file),
                "--", "/bin/sh", "-c", JOB.format(started=started)]
        watch = ProcWatch(tag.encode(), uid=None, arm_on=started)
        with watching(watch, armed=False):
            rc, out = dl(c, victim, "dl-run", *args,
                         extra_env={"DL_DRILL_ENV": f"{tag}-env"})
        assert rc == 0, out + c.controller_log()
        assert watch.armed.is_set() and watch.passes > 10, watch.passes  # it looked
        assert sorted(watch.seen, key=lambda s: s.pid) == [], managed
        for how in ("argv", "env", "file"):  # the job had every value
            assert f"DL_DRILL_{how.upper()}={tag}-{how}" in out, (managed, out)
