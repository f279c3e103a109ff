"""A kept cluster keeps playing AWS: the emulator's Auto Scaling and EC2 as a background
service of ``make demo ARGS=--keep``, stopped by ``--stop``.

moto never acts by itself; :class:`emulator.autoscaling.AutoScaling` does (boots a launched
instance's node, stops a terminated one's, replaces an unhealthy instance, delivers the
topic's notifications, restarts units as systemd would), one tick at a time, in the process
that booted the nodes (it holds their processes). So that ``dlc scale``, a killed node's
replacement and lifecycle hooks work on a kept cluster as during the demo (and, after ``dlc
down`` and ``dlc up``, for the new stack's groups: ``emulator.demo.restack``), a ``--keep`` run
forks before it starts anything (:func:`detach`):

- the child plays the demo in a process group of its own and, when it keeps the cluster,
  goes on as the service (:func:`serve`): it records itself in ``state.json``
  (``"service"``), moves its output to ``logs/emulator-service.log``, tells the parent the
  demo's exit code and ticks until SIGTERM;
- the parent, the process ``make`` started, relays SIGINT, SIGTERM and SIGHUP to the child
  and exits with the demo's exit code once it has it (or when the child ends).

``--stop`` stops the service first (so it replaces nothing being stopped), then reads
``state.json`` again for every node it booted.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Protocol

from bootstrap_scripts.node.procgroup import Tracked, start_time


class Demo(Protocol):
    """What the service needs of the demo (``emulator.demo.orchestration.Demo`` is one):
    named here, not imported, so the demo's module and this one do not import each other."""

    service: Tracked | None
    cluster: Any
    autoscaling: Any
    logs: Path
    console: Any

    def save_state(self) -> None: ...

#: The service's log, in the demo's logs directory.
SERVICE_LOG = "emulator-service.log"
#: The state file's key for the service's process group.
STATE_KEY = "service"

#: the write end of the pipe to the waiting parent (the child's, after :func:`detach`)
_to_parent: int | None = None


def detach() -> None:
    """Fork (module doc). Returns in the child only; the parent exits with the demo's
    exit code."""
    global _to_parent
    sys.stdout.flush()
    sys.stderr.flush()
    r, w = os.pipe()
    # Block the relayed signals across the fork: a Ctrl-C that arrives before the parent's
    # relay is in place stays pending and is relayed, instead of killing the parent alone
    # and leaving the child running unseen.
    relayed = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    before = signal.pthread_sigmask(signal.SIG_BLOCK, relayed)
    pid = os.fork()
    if pid == 0:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
        os.close(r)
        os.setpgid(0, 0)  # not the terminal's group: the service outlives the terminal job
        _to_parent = w
        return
    os.close(w)
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid)
    for sig in relayed:
        signal.signal(sig, lambda s, _f: os.kill(pid, s))
    signal.pthread_sigmask(signal.SIG_SETMASK, before)
    data = b""
    while chunk := os.read(r, 64):
        data += chunk
    if data.strip():
        os._exit(int(data))  # the demo is over; the child goes on as the service
    _, status = os.waitpid(pid, 0)
    os._exit(os.waitstatus_to_exitcode(status) % 256)


def detached() -> bool:
    return _to_parent is not None


def record(demo: Demo) -> None:
    """The child records itself as the service from the start (``state.json`` is written at
    every start of a process), so ``--stop`` or a test's last resort can stop it even if
    the demo hangs before it serves."""
    demo.service = Tracked("emulator service", os.getpid(), start_time(os.getpid()))


def serve(demo: Demo, code: int) -> int:
    """The child, after the demo: hand ``code`` to the parent; if the cluster is kept, tick
    the emulated Auto Scaling until SIGTERM. Returns the child's exit code."""
    global _to_parent
    if _to_parent is None or not getattr(demo, "kept", False) or demo.cluster is None:
        return code  # the parent reads EOF and waits for this process's exit code
    from emulator.demo import cluster
    from emulator.demo.restack import StackFollower

    record(demo)
    demo.save_state()
    autoscaling = demo.autoscaling or cluster.autoscaling(demo)
    demo.logs.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    log = os.open(demo.logs / SERVICE_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(null)
    os.close(log)
    stop = []
    signal.signal(signal.SIGTERM, lambda _s, _f: stop.append(True))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    os.write(_to_parent, f"{code}\n".encode())
    os.close(_to_parent)
    _to_parent = None
    demo.console.print(f"emulator service {os.getpid()}: playing Auto Scaling and EC2 for "
                       f"the kept cluster until --stop")
    failures = 0
    follower = StackFollower(demo)  # dlc down + dlc up: the new stack's instances boot
    while not stop:
        try:
            autoscaling = follower.tick() or autoscaling
            autoscaling.tick()
            failures = 0
        except Exception as exc:  # moto restarting, a node's files half written: go on
            failures += 1
            demo.console.print(f"tick failed ({failures}): {type(exc).__name__}: {exc}")
            if failures >= 120:  # a minute: the cloud is gone
                return 1
        time.sleep(0.5)
    demo.console.print("emulator service: stopped")
    return 0


def stop_service(state: dict) -> set[int]:
    """``--stop``'s first step: the service's group, if it recorded one; the survivors."""
    from bootstrap_scripts.node.procgroup import stop_groups

    rec = state.get(STATE_KEY)
    if not rec:
        return set()
    return stop_groups([Tracked.from_dict(rec)], grace=15)
