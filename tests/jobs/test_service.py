"""What the executor and the controller do alike as they start (``engine.service``): the
EFS mount point they use and the stop their signals ask for."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from bootstrap_scripts.jobs.engine import service
from bootstrap_scripts.protocol.paths import NodePaths


def test_the_mount_point_is_the_command_lines_then_the_node_agents_then_efs(tmp_path):
    assert service.efs_mount(tmp_path, None) == Path("/efs")  # no node variables yet
    env = NodePaths(tmp_path).env
    env.parent.mkdir(parents=True, exist_ok=True)
    env.write_text("EFS_MOUNT=/shared\n")
    assert service.efs_mount(tmp_path, None) == Path("/shared")
    assert service.efs_mount(tmp_path, "/mnt/efs") == Path("/mnt/efs")


class Service:
    stopping = False


def test_sigterm_and_sigint_ask_the_service_to_stop_after_its_pass():
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        for signum in saved:
            svc = Service()
            service.stop_on_signals(svc)
            os.kill(os.getpid(), signum)  # the handler runs before kill returns (main thread)
            assert svc.stopping, signal.Signals(signum).name
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
