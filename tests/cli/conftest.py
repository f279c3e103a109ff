"""The kept emulated cluster ``tests/cli/test_e2e.py`` shares between its tests (``make demo
ARGS=--keep``: a master and two base workers, the worker group's maximum two more, the
demo's default for a kept cluster, so it has room to scale out; deployed with a data bucket
its nodes may read, ``DATA_BUCKET`` / ``DATA_PREFIX``), and the cluster user its jobs run
as. Stopped at the module's end, always, by process group if ``--stop`` fails."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootstrap_scripts.node.procgroup import alive, pids_in_groups
from emulator.demo.context import STATE_FILE
from emulator.nodes import PYTHON
from tests.conftest import REPO_ROOT
from tests.support.demo import DEMO_TIMEOUT, demo_env
from tests.support.kept import (
    DATA_BUCKET,
    DATA_PREFIX,
    UNREACHABLE_ACC,
    demo_stop,
    state_groups,
)
from tests.support.users import CAN_CREATE_USERS, cluster_user, reachable


@pytest.fixture(scope="module")
def kept(tmp_path_factory) -> Iterator[dict]:
    tmp = tmp_path_factory.mktemp("dlc-e2e")
    report_path = tmp / "report.json"
    # no --work-dir: the demo makes a temp dir, and --stop must remove it (tested below).
    # The demo's job fails its accuracy target (out of reach in 2 epochs): a new user's first
    # failure, whose message and kept cluster the first-hour tests read
    proc = subprocess.run(
        [sys.executable, "-m", "emulator.demo", "--keep", "--workers", "2",
         "--context", f"dataBucket={DATA_BUCKET}", "--context",
         f"dataPrefix={DATA_PREFIX}", "--epochs", "2", "--require-acc", UNREACHABLE_ACC,
         "--report", str(report_path)],
        cwd=REPO_ROOT, env=demo_env(), capture_output=True, text=True, timeout=DEMO_TIMEOUT)
    report = json.loads(report_path.read_text())
    work = Path(report["work_dir"])
    state_path = work / STATE_FILE
    groups = state_groups(state_path)
    try:
        state = json.loads(state_path.read_text())
        assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
        yield {"state_path": state_path, "state": state, "out": proc.stdout, "report": report,
               "code": proc.returncode}
    finally:
        groups |= state_groups(state_path)  # nodes the service booted since
        stopped = not work.exists()  # the module's last test stops it (and checks --stop)
        if not stopped:
            stop = demo_stop(state_path)
        left = pids_in_groups(groups) | {g for g in groups if alive(g)}
        for pgid in left:
            os.killpg(pgid, signal.SIGKILL)
        if not stopped:
            assert stop.returncode == 0, stop.stdout + stop.stderr
        assert not left, f"processes left behind after --stop: {sorted(left)}"
        assert not work.exists(), "--stop did not remove the demo's temp dir"


@pytest.fixture(scope="module")
def job_user(kept: dict) -> Iterator[str]:
    """The cluster user jobs are submitted as (``dlc submit --as``: jobs never run as root,
    and the emulator's IAM identity, moto's ``user/moto``, is no user on this machine); the
    interpreter and the checkout reachable by it, as on a cluster (the fix the demo names
    when they are not: emulator/demo/user_access.py). The demo's own directory is left as
    the demo made it: cluster users must read the nodes' files there by themselves."""
    if not CAN_CREATE_USERS:
        pytest.skip("creating the job's user needs root")
    python_dir = os.path.realpath(os.path.dirname(PYTHON))
    with cluster_user() as user, reachable(os.path.realpath(PYTHON), PYTHON, python_dir + "/x",
                                            REPO_ROOT + "/x"):
        yield user.pw_name
