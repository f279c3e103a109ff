"""The shared clusters' teardown (``LocalCluster.stop``, used by ``make chaos``'s fixture)
stops an attempt runner the job controller started in a session of its own even before
that runner wrote its first heartbeat: such a runner, started as the controller was being
stopped, was the process ``make chaos`` once found left behind."""

from __future__ import annotations

import subprocess

from bootstrap_scripts.jobs.controller.attempts import runner_argv
from bootstrap_scripts.node.procgroup import alive, stop_popen_group
from emulator.nodes import base_env
from tests.conftest import REPO_ROOT
from tests.support.agents import wait_until
from tests.support.cluster import start_local_cluster


def test_a_runner_that_never_beat_is_stopped_with_the_cluster(tmp_path):
    c = start_local_cluster(tmp_path / "cluster", 1)
    # as attempts.spawn starts it: its own session, its request still to come on stdin
    runner = subprocess.Popen(runner_argv(root=str(c.master_root), efs=c.efs, membership=None),
                              cwd=REPO_ROOT, env=base_env(), stdin=subprocess.PIPE,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        # found by its command line in /proc, which can read empty for a moment while the
        # new program replaces the old (seen once under load in a whole-suite run)
        wait_until(lambda: runner.pid in c.attempt_runners(), 30, 0.1, "the runner seen")
        c.stop()
        assert runner.wait(timeout=30) is not None and not alive(runner.pid)
        assert not c.leftovers()
    finally:
        stop_popen_group(runner)
