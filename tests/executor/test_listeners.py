"""The root-bound rendezvous listener (``executor/listeners.py``, ``Proc.listen``): what a
spec may ask root to bind, the descriptor's hand-over to the store, who holds a port, and
the other nodes waiting for the master's listener. Fast, no users, no cluster (the drill
with real users is ``tests/security/test_rendezvous_port.py``)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from bootstrap_scripts.jobs.engine import rdzv_store
from bootstrap_scripts.jobs.executor import listeners, share_wrapper
from bootstrap_scripts.jobs.executor.discovery import JobScanner
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.jobs import (
    LISTEN_FD_VARIABLE,
    JobSpec,
    JobSpecError,
    Listener,
    Proc,
    Share,
)
from bootstrap_scripts.protocol.paths import JobPaths
from bootstrap_scripts.protocol.records import ShareStarted

MASTER, WORKER = "10.0.0.4", "10.0.1.5"


def spec_with(master_procs: tuple[Proc, ...], **changes) -> JobSpec:
    spec = JobSpec(job_id="job-1", launcher="torchrun", shares=(
        Share(0, MASTER, master_procs), Share(1, WORKER, (Proc(argv=("agent",)),))))
    return replace(spec, **changes)


STORE = Proc(argv=("python3", "rdzv_store.py"), label="rdzv-store", wait=False,
             listen=Listener(host=MASTER, port=294))


def test_a_listener_survives_the_spec_round_trip():
    spec = JobSpec.from_json(spec_with((Proc(argv=("agent",)), STORE)).to_json())
    assert spec.shares[0].procs[1].listen == Listener(host=MASTER, port=294)
    assert listeners.listener_share(spec).rank == 0


@pytest.mark.parametrize("port", [22, 80, 293, 310, 1023, 0, -1, 65536, True, "294", 29.4])
def test_root_is_never_asked_to_bind_a_port_outside_the_window_or_unprivileged(port):
    data = json.loads(spec_with((Proc(argv=("agent",)), STORE)).to_json())
    data["shares"][0]["procs"][1]["listen"]["port"] = port
    with pytest.raises(JobSpecError, match="listen"):
        JobSpec.from_json(json.dumps(data))


@pytest.mark.parametrize("allowed", [294, 309, 1024, 29400, 65535])
def test_the_window_and_unprivileged_ports_are_allowed(allowed):
    data = json.loads(spec_with((Proc(argv=("agent",)), STORE)).to_json())
    data["shares"][0]["procs"][1]["listen"]["port"] = allowed
    assert JobSpec.from_json(json.dumps(data)).shares[0].procs[1].listen.port == allowed


@pytest.mark.parametrize("where", ["worker share", "other host", "two", "join template"])
def test_only_the_masters_share_may_ask_for_one_listener_on_its_own_address(where):
    data = json.loads(spec_with((Proc(argv=("agent",)), STORE), elastic=True).to_json())
    listen = {"host": MASTER, "port": 294}
    if where == "worker share":
        data["shares"][1]["procs"][0]["listen"] = {"host": WORKER, "port": 294}
    elif where == "other host":
        data["shares"][0]["procs"][1]["listen"] = {"host": WORKER, "port": 294}
    elif where == "two":
        data["shares"][0]["procs"][0]["listen"] = listen
    else:
        data["join_template"] = {"argv": ["agent"], "listen": listen}
    with pytest.raises(JobSpecError, match="listen"):
        JobSpec.from_json(json.dumps(data))


def test_the_executor_binds_only_its_own_nodes_address():
    share = Share(0, MASTER, (STORE,))
    listeners.check(STORE.listen, share, MASTER)
    with pytest.raises(listeners.ListenerRefused, match=r"this node's address is 10\.0\.1\.5"):
        listeners.check(STORE.listen, share, WORKER)


def test_the_store_serves_on_the_descriptor_root_handed_over(tmp_path):
    """The hand-over: a listening socket bound here, inherited by a child through
    pass_fds and named by DL_LISTEN_FD, accepted on by the child (the store's own check
    of the descriptor, then accept), with nothing bound by the child itself."""
    held = listeners.bind(Listener(host="127.0.0.1", port=free_port()))
    port = held.getsockname()[1]
    child = (
        "import os, socket, sys\n"
        f"sys.path.insert(0, {str(Path(rdzv_store.__file__).parent)!r})\n"
        "import rdzv_store\n"
        f"fd = rdzv_store.inherited_listener('127.0.0.1', {port})\n"
        f"assert {LISTEN_FD_VARIABLE!r} not in os.environ\n"
        "conn, _ = socket.socket(fileno=fd).accept()\n"
        "conn.sendall(b'served by the handed-over socket')\n")
    try:
        p = subprocess.Popen([sys.executable, "-I", "-c", child], pass_fds=(held.fileno(),),
                             env={LISTEN_FD_VARIABLE: str(held.fileno())})
    finally:
        held.close()  # as the executor does once the process started
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
            assert c.recv(100) == b"served by the handed-over socket"
    finally:
        p.wait(timeout=10)
    assert p.returncode == 0


def test_the_store_refuses_a_descriptor_bound_elsewhere(monkeypatch):
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        monkeypatch.setenv(LISTEN_FD_VARIABLE, str(other.fileno()))
        with pytest.raises(ValueError, match=r"not a socket listening on 127\.0\.0\.1:294"):
            rdzv_store.inherited_listener("127.0.0.1", 294)
        port = other.getsockname()[1]  # the right port, but nobody listens: refused too
        monkeypatch.setenv(LISTEN_FD_VARIABLE, str(other.fileno()))
        with pytest.raises(ValueError, match="not a socket listening"):
            rdzv_store.inherited_listener("127.0.0.1", port)
    monkeypatch.delenv(LISTEN_FD_VARIABLE, raising=False)
    assert rdzv_store.inherited_listener("127.0.0.1", 294) is None  # binds itself


def test_the_variable_is_one_name_on_both_sides():
    assert rdzv_store.LISTEN_FD_VARIABLE == share_wrapper.LISTEN_FD_VARIABLE \
        == LISTEN_FD_VARIABLE


def test_a_taken_port_is_refused_naming_who_listens_there():
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        with pytest.raises(listeners.ListenerRefused) as err:
            listeners.bind(Listener(host="127.0.0.1", port=port))
    text = str(err.value)
    assert f"cannot listen on 127.0.0.1:{port}" in text
    assert f"socket of uid {listeners.who(os.getuid())}" in text
    assert f"pid {os.getpid()} of uid {listeners.who(os.getuid())}" in text


def test_proc_net_tcp_rows_are_read_in_host_byte_order():
    # the kernel prints each 32-bit word of the address as the number it is in memory
    v4 = words(socket.inet_aton("127.0.0.5"))
    v6 = words(socket.inet_pton(socket.AF_INET6, "fd00::1:2"))
    head = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   "
            "uid  timeout inode\n")
    rows = [f"   0: {v4}:0126 00000000:0000 0A 00000000:00000000 00:00000000 "
            "00000000  1001        0 4242 1 0 100 0 0 10 0",
            f"   1: {v4}:0126 0100007F:A000 01 00000000:00000000 00:00000000 "
            "00000000  1002        0 4343 1 0 100 0 0 10 0"]
    (found,) = listeners.parse_proc_net_tcp(head + "\n".join(rows))
    assert (found.address, found.port, found.uid, found.inode) == ("127.0.0.5", 294, 1001, 4242)
    assert listeners.parse_address(f"{v6}:0127") == ("fd00::1:2", 295)
    assert listeners.covers("0.0.0.0", "127.0.0.5") and listeners.covers("::", "127.0.0.5")
    assert listeners.covers("::ffff:127.0.0.5", "127.0.0.5")
    assert not listeners.covers("127.0.0.6", "127.0.0.5")


def test_the_other_nodes_start_only_once_the_masters_share_started_cleanly(tmp_path):
    spec = spec_with((Proc(argv=("agent",)), STORE))
    paths = JobPaths(tmp_path / "alice" / "job-1")
    paths.nodes.mkdir(parents=True)
    # only its bookkeeping is used here: a node without the key, shares that are not started
    scanner = JobScanner(SimpleNamespace(paths=SimpleNamespace(root=tmp_path / "node")),
                         SimpleNamespace(), None, None)
    worker = spec.shares[1]
    assert listeners.waits_for_listener(spec, spec.shares[0]) is None
    assert not scanner.listener_ready(spec, worker, paths)  # not started yet: pending
    assert "alice/job-1" not in scanner.seen
    store.write_record(paths.started(0), ShareStarted(
        rank=0, address=MASTER, started_at=1.0,
        error="cannot listen on 10.0.0.4:294 for the job's rendezvous"))
    assert not scanner.listener_ready(spec, worker, paths)
    assert "alice/job-1" in scanner.seen  # the master could not listen: never started here
    scanner.seen.clear()
    store.write_record(paths.started(0), ShareStarted(rank=0, address=MASTER, started_at=1.0,
                                                      pgid=7))
    assert scanner.listener_ready(spec, worker, paths)
    no_listener = spec_with((Proc(argv=("agent",)),))
    assert scanner.listener_ready(no_listener, no_listener.shares[1], paths)


def words(raw: bytes) -> str:
    return "".join(f"{int.from_bytes(raw[i:i + 4], sys.byteorder):08X}"
                   for i in range(0, len(raw), 4))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
