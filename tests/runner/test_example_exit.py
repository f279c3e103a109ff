"""The example's way out (``train_digits.exit_without_teardown``): the status, the output and
an exception's traceback survive skipping the interpreter's teardown."""

from __future__ import annotations

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
