"""An emulated AWS that can go silent: moto's server (``emulator.cloud``) in a process of
its own, stopped with SIGSTOP and resumed with SIGCONT, as an outage or a partition to the
endpoint looks to a client (connections complete in the kernel, nothing ever answers).

The process is stopped by its group at the end, resumed first so it can exit."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from bootstrap_scripts.node.procgroup import stop_popen_group
from emulator.cloud import free_port
from emulator.nodes import base_env
from tests.conftest import REPO_ROOT


class SilentCloud:
    """moto in its own process group: ``endpoint``, :meth:`stop` and :meth:`resume`."""

    def __init__(self, proc: subprocess.Popen, endpoint: str) -> None:
        self.proc, self.endpoint = proc, endpoint

    def silence(self) -> None:
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.killpg(self.proc.pid, signal.SIGCONT)


@contextlib.contextmanager
def silent_cloud(state_dir: Path) -> Iterator[SilentCloud]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "emulator.cloud", "--port", str(port),
                             "--state-dir", str(state_dir)], cwd=REPO_ROOT,
                            env=base_env(), stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        info = json.loads(line) if line.strip() else {}
        assert "endpoint" in info, f"moto's server did not start: {line!r}"
        yield SilentCloud(proc, info["endpoint"])
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGCONT)
        stop_popen_group(proc)
