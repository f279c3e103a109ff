"""emulator/node_bind.c: a wildcard bind on one emulated node leaves the port free on the
others, as on separate instances; without it, the second node's bind fails. Every emulated
node's executor preloads it, so a job started the product's way binds as on AWS."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from emulator.node_network import bind_preload, dl_run_args
from emulator.resources import loopback_instances
from tests.conftest import free_port

#: Binds the wildcard address (IPv4 or dual-stack IPv6, as gRPC does) on PORT, prints the
#: address it got, then waits for stdin to close so that two of them hold the port together.
SERVER = """
import socket, sys
family = socket.AF_INET6 if sys.argv[1] == "6" else socket.AF_INET
s = socket.socket(family, socket.SOCK_STREAM)
if family == socket.AF_INET6:
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
try:
    s.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", int(sys.argv[2])))
except OSError as exc:
    print("bind failed", exc.errno, flush=True)
    sys.exit(3)
s.listen()
print("bound", s.getsockname()[0], flush=True)
sys.stdin.read()
"""


def _servers(addresses: list[str], family: str, port: int, lib: Path | None) -> list[str]:
    """One server per node address, each started once the previous one holds its bind; what
    each printed."""
    procs, out = [], []
    try:
        for addr in addresses:
            env = {**os.environ, "DEEPLEARNING_NODE_ADDR": addr}
            if lib is not None:
                env["LD_PRELOAD"] = str(lib)
            p = subprocess.Popen([sys.executable, "-c", SERVER, family, str(port)], env=env,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            procs.append(p)
            out.append(p.stdout.readline().strip())
    finally:
        for p in procs:
            p.stdin.close()
            p.wait(timeout=10)
    return out


def test_wildcard_binds_of_two_nodes_share_a_port_with_the_preload(tmp_path):
    lib = bind_preload(tmp_path)
    a, b = (i.address for i in loopback_instances(2))
    for family in ("4", "6"):
        port = free_port(a)
        got = _servers([a, b], family, port, lib)
        mapped = "::ffff:" if family == "6" else ""
        assert got == [f"bound {mapped}{a}", f"bound {mapped}{b}"], got


def test_without_the_preload_the_second_node_cannot_bind():
    a, b = (i.address for i in loopback_instances(2))
    port = free_port(a)
    got = _servers([a, b], "4", port, None)
    assert got[0] == "bound 0.0.0.0", got
    assert got[1] == "bind failed 98", got  # EADDRINUSE


def test_other_binds_and_processes_outside_a_node_are_untouched(tmp_path):
    lib = bind_preload(tmp_path)
    a = loopback_instances(1)[0].address
    port = free_port(a)
    env = {k: v for k, v in os.environ.items() if k != "DEEPLEARNING_NODE_ADDR"}
    res = subprocess.run([sys.executable, "-c", SERVER, "4", str(port)], input="",
                         env={**env, "LD_PRELOAD": str(lib)}, capture_output=True, text=True,
                         timeout=30)
    assert res.stdout.strip() == "bound 0.0.0.0", res.stdout + res.stderr
    assert dl_run_args(lib) == ["--env", f"LD_PRELOAD={lib}"]
    assert bind_preload(tmp_path) == lib  # built once


#: Connects to HOST:PORT without binding first and prints the address it left from.
CLIENT = """
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
print(s.getsockname()[0], flush=True)
"""


def test_connections_leave_from_the_nodes_address_when_asked(tmp_path):
    """``DEEPLEARNING_NODE_CONNECT=1``: an unbound socket's connection leaves from the node's
    address (Slurm's controller records a dynamic node's address from it); without it, from
    the kernel's choice for a loopback destination, 127.0.0.1."""
    import socket

    lib = bind_preload(tmp_path)
    server_addr, node = (i.address for i in loopback_instances(2))
    with socket.create_server((server_addr, 0)) as srv:
        port = srv.getsockname()[1]
        seen = {}
        for connect in ("1", ""):
            env = {**os.environ, "DEEPLEARNING_NODE_ADDR": node, "LD_PRELOAD": str(lib),
                   "DEEPLEARNING_NODE_CONNECT": connect}
            out = subprocess.run([sys.executable, "-c", CLIENT, server_addr, str(port)],
                                 env=env, capture_output=True, text=True, timeout=30)
            conn, peer = srv.accept()
            conn.close()
            seen[connect] = (out.stdout.strip(), peer[0])
    assert seen["1"] == (node, node)
    assert seen[""] == ("127.0.0.1", "127.0.0.1")


#: Connects to HOST:PORT from a dual-stack IPv6 socket (the peer IPv4-mapped, as PyTorch's
#: TCPStore client does) without binding first and prints the address it left from.
CLIENT6 = """
import socket, sys
s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
s.settimeout(10)
s.connect(("::ffff:" + sys.argv[1], int(sys.argv[2])))
print(s.getsockname()[0], flush=True)
"""


def test_a_dual_stack_connection_leaves_from_the_nodes_address_too(tmp_path):
    """``DEEPLEARNING_NODE_CONNECT=1`` on an IPv6 socket to an IPv4-mapped peer (PyTorch's
    rendezvous store client): it leaves from the node's address in its mapped form, so a
    partition between two nodes' addresses cuts it as it cuts an IPv4 socket's."""
    import socket

    lib = bind_preload(tmp_path)
    server_addr, node = (i.address for i in loopback_instances(2))
    with socket.create_server((server_addr, 0)) as srv:
        port = srv.getsockname()[1]
        seen = {}
        for connect in ("1", ""):
            env = {**os.environ, "DEEPLEARNING_NODE_ADDR": node, "LD_PRELOAD": str(lib),
                   "DEEPLEARNING_NODE_CONNECT": connect}
            out = subprocess.run([sys.executable, "-c", CLIENT6, server_addr, str(port)],
                                 env=env, capture_output=True, text=True, timeout=30)
            conn, peer = srv.accept()
            conn.close()
            seen[connect] = (out.stdout.strip(), peer[0])
    assert seen["1"] == (f"::ffff:{node}", node)
    assert seen[""] == ("::ffff:127.0.0.1", "127.0.0.1")


def test_an_ec2_host_name_names_the_node_without_the_variable(tmp_path):
    """A Slurm task's environment is its submitter's; in an emulated node's UTS namespace
    (host name ``ip-a-b-c-d``) the preload takes the node's address from the host name."""
    lib = bind_preload(tmp_path)
    (node,) = (i.address for i in loopback_instances(1))
    name = "ip-" + node.replace(".", "-")
    env = {k: v for k, v in os.environ.items() if k != "DEEPLEARNING_NODE_ADDR"}
    bind = ("import socket; s = socket.socket(); s.bind(('0.0.0.0', 0)); "
            "print(s.getsockname()[0])")
    out = subprocess.run(["unshare", "--uts", "--", "/bin/sh", "-c",
                          'hostname "$0" && exec "$@"', name, sys.executable, "-c", bind],
                         env={**env, "LD_PRELOAD": str(lib)}, capture_output=True, text=True,
                         timeout=30, check=True)
    assert out.stdout.strip() == node
    out = subprocess.run([sys.executable, "-c", bind], env={**env, "LD_PRELOAD": str(lib)},
                         capture_output=True, text=True, timeout=30, check=True)
    assert out.stdout.strip() == "0.0.0.0"  # this host's own name is no node's


def test_the_host_name_wins_over_a_submitters_node_address(tmp_path):
    """sbatch exports the submitter's whole environment, DEEPLEARNING_NODE_ADDR (the master's)
    included, to every task: a task in another node's namespace must still bind that node's
    address (before, the head task's store bound the master's and every client timed out)."""
    lib = bind_preload(tmp_path)
    submitter, node = (i.address for i in loopback_instances(2))
    bind = ("import socket; s = socket.socket(); s.bind(('0.0.0.0', 0)); "
            "print(s.getsockname()[0])")
    env = {**os.environ, "LD_PRELOAD": str(lib), "DEEPLEARNING_NODE_ADDR": submitter}
    out = subprocess.run(["unshare", "--uts", "--", "/bin/sh", "-c",
                          'hostname "$0" && exec "$@"', "ip-" + node.replace(".", "-"),
                          sys.executable, "-c", bind],
                         env=env, capture_output=True, text=True, timeout=30, check=True)
    assert out.stdout.strip() == node
    out = subprocess.run([sys.executable, "-c", bind], env=env, capture_output=True,
                         text=True, timeout=30, check=True)
    assert out.stdout.strip() == submitter  # outside a node's namespace: the variable


#: A job's command: bind the wildcard on PORT, hold it until every node holds it (a file per
#: node in DIR), print the address the bind got.
HOLDER = """
import os, socket, sys, time
port, d = int(sys.argv[1]), sys.argv[2]
s = socket.socket()
s.bind(("0.0.0.0", port))
s.listen()
open(os.path.join(d, os.environ["DEEPLEARNING_NODE_ADDR"]), "w").close()
deadline = time.monotonic() + 60
while len(os.listdir(d)) < int(sys.argv[3]) and time.monotonic() < deadline:
    time.sleep(0.1)
print("bound", s.getsockname()[0], flush=True)
"""


def test_a_job_on_emulated_nodes_binds_the_wildcard_to_each_nodes_own_address(emu, tmp_path):
    """dl-run as on AWS (no option of the emulator's): two nodes' ranks bind 0.0.0.0 on the
    same port at the same time, each getting its own node's address."""
    c = emu(2)
    c.start_executors()
    held = tmp_path / "held"
    held.mkdir()
    port = free_port(c.addresses[0])
    res = c.run("--launcher", "each", "--", sys.executable, "-c", HOLDER, str(port), str(held),
                "2", timeout=240)
    assert res.returncode == 0, res.stdout
    for rank, address in enumerate(c.addresses):
        assert f"[{rank} {address}] bound {address}" in res.stdout, res.stdout
