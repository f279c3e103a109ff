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

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from bootstrap_scripts import tensorboard_log
from bootstrap_scripts.ops import tensorboard_server as tb
from bootstrap_scripts.protocol.paths import ClusterPaths
from tests.conftest import REPO_ROOT
from tests.security.conftest import as_user

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
    uid, gid = victim.pw_uid, victim.pw_gid
    efs = Path(tempfile.mkdtemp(prefix="dl-tb-sec-", dir="/tmp"))
    served = None
    try:
        os.chmod(efs, 0o755)
        paths = ClusterPaths(efs).managed("tb-secret")
        paths.dir.parent.mkdir(parents=True)
        paths.dir.mkdir(mode=0o700)
        paths.request.write_text("{}")
        for p in (paths.dir, paths.request):
            os.chown(p, uid, gid)
        writer = subprocess.run(  # the job's scalars, written as the victim
            [sys.executable, "-c", "from bootstrap_scripts import tensorboard_log as t;"
             " w = t.open_writer(); t.scalars(w, 1, loss=0.5); t.close(w)"],
            env={"PATH": "/usr/bin:/bin", "HOME": victim.pw_dir, "PYTHONPATH": REPO_ROOT,
                 tensorboard_log.DIR_ENV: str(paths.tensorboard_dir)},
            cwd="/", user=uid, group=gid, extra_groups=[], capture_output=True, text=True,
            timeout=60)
        assert writer.returncode == 0, writer.stderr[-2000:]

        res = subprocess.run([sys.executable, "-m", "bootstrap_scripts.jobs.cli.dl_jobs",
                              "--mount-point", str(efs), "tensorboard", "tb-secret", "--port",
                              str(tb.pick_port(17006)), "--minutes", "5"],
                             capture_output=True, text=True, timeout=90, cwd=REPO_ROOT)
        assert res.returncode == 0, res.stderr
        served = json.loads(res.stdout)
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
    finally:
        if served is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(served["pid"], signal.SIGKILL)
            with contextlib.suppress(OSError):
                (tb.ROOT_STATE_DIR / "tb-secret.json").unlink()
        shutil.rmtree(efs, ignore_errors=True)
