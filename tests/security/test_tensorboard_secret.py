"""Drill: another user on the master reads a running job's TensorBoard (F16 before).

A job's TensorBoard listens on the master's loopback, which every process there reaches,
another cluster user's shell or job ranks included. It serves under a random secret path
and answers 404 elsewhere; the secret is given to it on a pipe, never on its (public)
command line. The attacker, a REAL second unprivileged user, probes the port, reads every
process's command line and environment it can, and the root service's records: no scalars,
no secret. The victim's URL (what ``dl-jobs tensorboard`` printed) serves them, so the drill
would see a leak. Root only; one TensorBoard process, no cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from bootstrap_scripts.ops import tensorboard_server as tb
from tests.security.conftest import as_user
from tests.support.tensorboard_job import tensorboard_job

pytestmark = [pytest.mark.slow]

#: the attacker's side: the port's pages, every command line and environment it can read,
#: the root service's records; JSON of what it got
PROBE = """
import json, os, sys, urllib.error, urllib.request
port, secret, state = sys.argv[1], sys.argv[2], sys.argv[3]
pages = {}
for path in ("/", "/data/runs", "/data/plugin/scalars/tags", "/data/environment"):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            pages[path] = r.status
    except urllib.error.HTTPError as exc:
        pages[path] = exc.code
seen, environ_read = [], []
for pid in filter(str.isdigit, os.listdir("/proc")):
    if int(pid) == os.getpid():
        continue  # this probe was handed the secret to look for it
    for part in ("cmdline", "environ"):
        try:
            with open(f"/proc/{pid}/{part}", "rb") as fh:
                data = fh.read()
        except OSError:
            continue
        if part == "environ":
            environ_read.append(pid)
        if secret.encode() in data:
            seen.append(f"{pid}/{part}")
try:
    os.listdir(state)
    state_listed = True
except OSError:
    state_listed = False
print(json.dumps({"pages": pages, "seen": seen, "environ_read": environ_read,
                  "state_listed": state_listed}))
"""


def scalars_tags(url: str) -> dict:
    with urllib.request.urlopen(url + "data/plugin/scalars/tags", timeout=10) as page:
        return json.loads(page.read())


def test_another_user_on_the_master_cannot_read_a_jobs_tensorboard(victim, attacker,
                                                                   reachable_python):
    with tensorboard_job(victim, "tb-secret", prefix="dl-tb-sec-") as job:
        writer = subprocess.run(  # the job's scalars, written as the victim
            [sys.executable, "-c", "from bootstrap_scripts import tensorboard_log as t;"
             " w = t.open_writer(); t.scalars(w, 1, loss=0.5); t.close(w)"],
            env=job.user_env(), cwd="/", user=victim.pw_uid, group=victim.pw_gid,
            extra_groups=[], capture_output=True, text=True, timeout=60)
        assert writer.returncode == 0, writer.stderr[-2000:]

        served = job.start(17006)
        secret = served["path"].strip("/")
        assert served["url"].endswith(served["path"]) and len(secret) >= 32

        got = json.loads(as_user(attacker, PROBE, str(served["port"]), secret,
                                 str(tb.ROOT_STATE_DIR)).stdout)
        assert set(got["pages"].values()) == {404}, got["pages"]  # nothing served to them
        assert got["seen"] == [], f"the secret is readable by another user: {got['seen']}"
        assert str(served["pid"]) not in got["environ_read"]
        assert not got["state_listed"]
        # the control: the URL dl-jobs printed serves the victim's scalars (once loaded)
        deadline, tags = time.monotonic() + 30, {}
        while "loss" not in tags and time.monotonic() < deadline:
            tags = next(iter(scalars_tags(served["url"]).values()), {})
            time.sleep(0.5)
        assert "loss" in tags, tags


def test_two_users_jobs_of_the_same_id_never_share_a_tensorboard(victim, attacker,
                                                                 reachable_python):
    """The root service keys a TensorBoard by the job's user AND id: asked (by the operator
    channel, as root) for the attacker's job of the same id, it neither answers with the
    victim's server (logdir, secret URL) nor stops it."""
    efs = Path(tempfile.mkdtemp(prefix="dl-tb-same-", dir="/tmp"))
    try:
        with tensorboard_job(victim, "same-id", prefix="", efs=efs) as mine, \
                tensorboard_job(attacker, "same-id", prefix="", efs=efs) as theirs:
            served = mine.start(17106)
            stopped = theirs.dl_jobs("--stop")
            assert stopped.returncode == 0, stopped.stderr
            assert "no TensorBoard runs" in json.loads(stopped.stdout)["message"]
            os.killpg(served["pid"], 0)  # the victim's server still runs (else: raises)
            other = theirs.start(17206)
            assert other["logdir"] == str(theirs.paths.tensorboard_dir) != served["logdir"]
            assert other["url"] != served["url"] and not other["already_running"]
    finally:
        shutil.rmtree(efs, ignore_errors=True)
