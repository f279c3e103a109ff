"""The example's way out (``train_digits.exit_without_teardown``): the status, the output and
an exception's traceback survive skipping the interpreter's teardown."""

from __future__ import annotations

import json
import os
import subprocess
import sys

RUN = ("import sys; from bootstrap_scripts.examples.train_digits import exit_without_teardown\n"
       "def run():\n"
       "    print('line out', end='')\n"
       "    sys.stderr.write('line err')\n"
       "    {body}\n"
       "exit_without_teardown(run)\n")


def run(body: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", RUN.format(body=body)], capture_output=True,
                          text=True, timeout=60, check=False)


def test_the_status_of_main_and_its_unflushed_output_are_kept():
    done = run("return 3")
    assert done.returncode == 3
    assert done.stdout == "line out" and done.stderr == "line err"


def test_an_exception_prints_its_traceback_and_exits_1():
    done = run("raise RuntimeError('peer lost')")
    assert done.returncode == 1
    assert done.stdout == "line out"
    assert "Traceback" in done.stderr and "RuntimeError: peer lost" in done.stderr


def test_systemexit_takes_the_ordinary_way_out():
    done = run("raise SystemExit(2)")
    assert done.returncode == 2
    assert done.stdout == "line out"


def test_the_last_progress_step_is_written_though_atexit_is_skipped(tmp_path):
    """``progress`` writes a step reported within its interval at exit (``atexit``), which
    ``os._exit`` skips: the way out flushes it itself."""
    env = {**os.environ, "DL_PROGRESS_DIR": str(tmp_path), "DL_PROGRESS_INTERVAL": "60",
           "RANK": "0"}
    body = ("from bootstrap_scripts import progress\n"
            "    progress.report(1)\n"
            "    progress.report(2)\n"  # within the interval: pending, written at exit
            "    return 0")
    done = subprocess.run([sys.executable, "-c", RUN.format(body=body)], capture_output=True,
                          text=True, timeout=60, check=False, env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "0.json").read_text())["step"] == 2
