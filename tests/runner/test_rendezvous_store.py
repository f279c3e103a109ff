"""The torchrun rendezvous store outlives every agent of its job (real torchrun, 3 nodes).

When the master's torchrun agent hosted the store, a successful job ended with pages of
``TCPStore.cpp … recvVector failed … RendezvousConnectionError`` and "failed to shutdown
the rendezvous" from the other nodes: the master's agent left torch's exit barrier first
and took the store with it. The store is now a process of the master's share, stopped
only after every other share exited.
"""

from __future__ import annotations

import os
import socket

import pytest

from bootstrap_scripts.jobs.engine.rdzv_store import RDZV_STORE_LABEL
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.jobs import DEFAULT_RDZV_PORT
from bootstrap_scripts.protocol.paths import JobPaths
from bootstrap_scripts.protocol.records import ShareExit, ShareStarted
from tests.support.cluster import free_rdzv_port

pytestmark = pytest.mark.slow

#: What torch prints when an agent loses the rendezvous store while shutting down.
SHUTDOWN_RACE = ("RendezvousConnectionError", "recvVector failed", "recvValueWithTimeout failed",
                 "failed to shutdown the rendezvous", "Error waiting on exit barrier",
                 "TCPStore.cpp")


def test_a_successful_torchrun_job_ends_without_rendezvous_errors(emu):
    c = emu(3)
    c.start_executors()
    # the default port: the rendezvous window's, bound by the master's root executor and
    # handed to the store as the job's user (docs/security.md, L27)
    res = c.run("--", "python", "-m", "bootstrap_scripts.examples.train_digits", "--epochs", "3")
    assert res.returncode == 0, res.stdout
    (jdir,) = c.job_dirs()
    assert f"job {jdir.name} succeeded on 3 node(s)" in res.stdout
    found = [line for line in res.stdout.splitlines() if any(m in line for m in SHUTDOWN_RACE)]
    assert not found, res.stdout
    paths = JobPaths(jdir)
    # Every agent was a client: the master's store process served them all, and its share
    # was the last to end (its exit is recorded once every other share's is).
    exits = {rank: store.read_record(paths.exit(rank), ShareExit) for rank in range(3)}
    assert all(e.returncode == 0 for e in exits.values()), exits
    assert exits[0].finished_at >= max(exits[r].finished_at for r in (1, 2)), exits
    assert paths.log(0, RDZV_STORE_LABEL).read_text() == ""  # it served without complaint
    commands = (jdir / "commands.txt").read_text()
    assert "is_host=true" not in commands
    assert f"--rdzv-endpoint={c.membership.master_addr}:{DEFAULT_RDZV_PORT}" in commands


def test_a_taken_rendezvous_port_fails_the_job_at_once_naming_its_holder(emu):
    c = emu(2)
    c.start_executors()
    port = free_rdzv_port(c)
    # Something else already listens on the rendezvous port (every address): the master's
    # executor cannot bind the job's listener, so the master's share fails before any of
    # its processes starts, naming who listens there, and the other node never starts an
    # agent that would talk to that listener instead of the job's store.
    with socket.socket(socket.AF_INET6) as blocker:
        blocker.bind(("::", int(port)))
        blocker.listen()
        res = c.run("--rdzv-port", port, "--fail-grace", "2", "--grace", "2", "--",
                    "python", "-m", "bootstrap_scripts.examples.train_digits", "--epochs", "1")
    assert res.returncode == 1, res.stdout
    assert f"cannot listen on {c.membership.master_addr}:{port}" in res.stdout, res.stdout
    assert f"pid {os.getpid()} of uid 0 (root)" in res.stdout, res.stdout
    (jdir,) = c.job_dirs()
    paths = JobPaths(jdir)
    assert store.read_record(paths.started(0), ShareStarted).pids == ()
    assert not paths.started(1).exists()  # the worker waited for the master's listener
    assert not paths.log(0, RDZV_STORE_LABEL).exists()
