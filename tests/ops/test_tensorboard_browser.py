"""A job's TensorBoard, looked at in a real headless browser.

A real short CPU run of the example (``train_digits``, two epochs) as a real unprivileged
user writes its event files into its managed job's directory (``DL_TENSORBOARD_DIR``, as the
controller sets it); ``dl-jobs tensorboard`` (run as root, as the operator channel runs it)
starts TensorBoard as that user on 127.0.0.1; Debian's chromium, driven by Playwright, opens
the page and must show the example's scalar tags in the DOM that TensorBoard's JavaScript
rendered: they are not in the HTML the server sends (checked), so an HTTP 200 alone passes
nothing. The rendered page is kept as ``build/test-artifacts/tensorboard.png``. Root only
(it creates the user); chromium from ``make system-deps``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.support.tensorboard_job import tensorboard_job
from tests.support.users import CAN_CREATE_USERS, job_user, reachable_python  # noqa: F401

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
#: The page as the browser rendered it, kept for a person to look at (git-ignored).
SCREENSHOT = Path(REPO_ROOT) / "build" / "test-artifacts" / "tensorboard.png"
#: what the example writes (bootstrap_scripts/examples/train_digits.py)
TAGS = ("loss", "accuracy", "step_time_s")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CAN_CREATE_USERS, reason="creates a Linux user: root only"),
    pytest.mark.skipif(not os.path.exists(CHROMIUM),
                       reason="Debian's chromium is not installed (make system-deps)"),
]


def uid_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"no Uid in /proc/{pid}/status")


def test_the_examples_scalars_show_in_a_headless_browser(job_user, reachable_python):  # noqa: F811
    from playwright.sync_api import sync_playwright

    uid, gid = job_user.pw_uid, job_user.pw_gid
    with tensorboard_job(job_user, "tb-job", prefix="dl-tb-efs-") as job:
        paths = job.paths
        run = subprocess.run(
            [sys.executable, "-m", "bootstrap_scripts.examples.train_digits", "--epochs", "2",
             "--checkpoint-dir", str(paths.dir / "ck")],
            env=job.user_env(), cwd="/", user=uid, group=gid, extra_groups=[],
            capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr[-2000:]
        events = list(paths.tensorboard_dir.glob("events.out.tfevents.*"))
        assert events and all(e.stat().st_uid == uid for e in events)  # the user's, not root's

        served = job.start(16006)
        assert served["uid"] == uid and uid_of(served["pid"]) == uid  # never root
        url = served["url"]
        assert url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(url, timeout=10) as page:
            html = page.read().decode(errors="replace")
        assert page.status == 200 and not any(t in html for t in TAGS)  # JS must render them

        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                         args=["--no-sandbox"])
            try:
                tab = browser.new_page()
                tab.goto(url + "#timeseries")
                tab.wait_for_function(
                    "tags => tags.every(t => document.body.innerText.split(/\\s+/).includes(t))",
                    arg=list(TAGS), timeout=25_000)
                words = tab.inner_text("body").split()
                SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
                tab.screenshot(path=str(SCREENSHOT), full_page=True)
            finally:
                browser.close()
        assert set(TAGS) <= set(words)
        assert "no_such_scalar" not in words
        assert SCREENSHOT.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
