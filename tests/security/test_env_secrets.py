"""Drill: another user looks for the victim's ``--env`` values (F7).

``dl-run --env NAME=VALUE`` values travel in the job's files on EFS (the spec every
executor reads, the rendered commands, a managed job's request). Those are the owner's
alone (mode 0600; the root services read them all the same), and ``dl-jobs`` never prints
them: another user finds the value in no file and in no ``dl-jobs`` output.
"""

from __future__ import annotations

import json
import re
import secrets

import pytest

from tests.security.conftest import as_user, dl

pytestmark = [pytest.mark.slow]

#: the attacker's side: read every file of EFS it can, list those holding the value
HUNT = """
import json, os, sys
root, value = sys.argv[1], sys.argv[2].encode()
found, denied = [], 0
for d, dirs, files in os.walk(root):
    for name in files:
        try:
            with open(os.path.join(d, name), "rb") as fh:
                if value in fh.read():
                    found.append(os.path.join(d, name))
        except OSError:
            denied += 1
print(json.dumps({"found": found, "denied": denied}))
"""

SUBMITTED_RE = re.compile(r"^\[dl-run\] job (\S+) submitted", re.M)


def test_another_user_cannot_read_a_jobs_env_values(cluster, victim, attacker):
    c = cluster
    value = f"s3cret-{secrets.token_hex(8)}"
    command = ("--env", f"DL_DRILL_TOKEN={value}", "--launcher", "each", "--",
               "python", "-c", "print('done')")
    rc, unmanaged = dl(c, victim, "dl-run", "--unmanaged", *command)
    assert rc == 0, unmanaged
    rc, managed = dl(c, victim, "dl-run", *command)
    assert rc == 0, managed + c.controller_log()
    submitted = SUBMITTED_RE.search(managed)
    assert submitted, managed
    managed_id = submitted.group(1)

    hunt = as_user(attacker, HUNT, str(c.efs), value)
    assert hunt.returncode == 0, hunt.stderr
    assert json.loads(hunt.stdout)["found"] == [], hunt.stdout
    outputs = {}
    for who, user in (("attacker", attacker), ("victim", victim)):
        for args in (("list",), ("--json", "list"), ("show", managed_id),
                     ("show", managed_id, "--json"), ("logs", managed_id)):
            rc, out = dl(c, user, "dl-jobs", *args, timeout=60)
            outputs[(who, *args)] = out
            assert value not in out, (who, args, out)
    assert "done" in outputs[("victim", "logs", managed_id)]  # the logs were there to see
    # the owner still has them, and so do the root services
    owner = as_user(victim, HUNT, str(c.efs), value)
    assert len(json.loads(owner.stdout)["found"]) >= 3, owner.stdout
