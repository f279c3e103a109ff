"""Drill: another user connects to whatever a running torchrun job listens on.

Besides its rendezvous store (guarded on its own: ``test_rendezvous_store_guard.py``), a
torchrun job listens on ports chosen at run time: the workers' store, a TCPStore torch's agent
opens on a free port (``TORCHELASTIC_USE_AGENT_STORE``), and gloo's sockets. None
authenticates a client, and ``/proc/net/tcp`` shows every listening socket with its uid to
every user. A REAL unprivileged user (the attacker) reads the victim's listening sockets there
and connects to each, and, where a TCPStore answers, sets a key in it (the workers' store:
``MASTER_ADDR`` lives there, and a wrong value sends ranks to a peer of the attacker's).

The victim's job is a real one-node torchrun job whose worker joins a gloo process group,
started by the real executor code (``Shares.start`` as root, the share's processes as the
victim), with no cluster boot; the executor's loop is played by calling ``supervise``. With
the listener guard every connection is reset and the job finishes; the control shows that
without it the attacker connects and writes into the job's store.

Needs root (real users, nftables); CI runs as root.
"""

from __future__ import annotations

import os
import pwd
import re
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootstrap_scripts.jobs.executor import listen_guard
from bootstrap_scripts.jobs.executor.node import ThisNode
from bootstrap_scripts.jobs.executor.shares import Shares
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.records import ShareExit
from emulator.nodes import PYTHON
from tests.security.conftest import user_env, wait_until
from tests.support.drill_node import drill_node, torchrun_job

pytestmark = [pytest.mark.slow]

#: the victim's worker: joins a gloo group (its sockets, the workers' store), says so, waits
#: for the drill to release it, then a barrier (the group still works) and exits 0
TRAIN = r'''
import pathlib, sys, time
import torch.distributed as dist

d = pathlib.Path(sys.argv[1])
dist.init_process_group("gloo")
(d / "worker-started").write_text("")
deadline = time.time() + 90
while not (d / "release").exists() and time.time() < deadline:
    time.sleep(0.1)
dist.barrier()
dist.destroy_process_group()
'''

#: the attacker: ``python -c ATTACK <victim uid>``; one line per listening socket of that
#: uid: ``<host>:<port> refused|open|store-set``
ATTACK = r'''
import socket, sys
from datetime import timedelta

uid = int(sys.argv[1])


def address(hexaddr):
    raw = bytes.fromhex(hexaddr)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    import ipaddress
    ip = ipaddress.ip_address(words)
    if ip.is_unspecified:
        return "127.0.0.1"
    return str(ip.ipv4_mapped or ip) if ip.version == 6 else str(ip)


targets = set()
for name in ("tcp", "tcp6"):
    for line in open(f"/proc/net/{name}").read().splitlines()[1:]:
        w = line.split()
        if w[3] == "0A" and int(w[7]) == uid:
            host, port = w[1].rsplit(":", 1)
            targets.add((address(host), int(port, 16)))
import os, threading
from torch.distributed import TCPStore


def set_key(host, port, done):
    try:
        TCPStore(host, port, is_master=False, wait_for_workers=False,
                 timeout=timedelta(seconds=2)).set("dl-drill", "attacker")
        done.append(True)
    except Exception:
        pass


for host, port in sorted(targets):
    try:
        socket.create_connection((host, port), timeout=3).close()
    except OSError as exc:
        print(f"{host}:{port} refused {exc}", flush=True)
        continue
    done = []
    t = threading.Thread(target=set_key, args=(host, port, done), daemon=True)
    t.start()
    t.join(2)  # a socket that is not a store (gloo's) may never answer the handshake
    print(f"{host}:{port} {'store-set' if done else 'open'}", flush=True)
os._exit(0)
'''


@pytest.fixture()
def node(victim) -> Iterator[tuple[ThisNode, Path]]:
    with drill_node("dl-listen-guard-", 79, TRAIN) as found:
        yield found


def victims_listeners(uid: int) -> set[str]:
    """``host:port`` of every TCP socket ``uid`` listens on, as ``ss`` shows them."""
    out = subprocess.run(["ss", "-Hltn", "-e"], capture_output=True, text=True,
                         check=True).stdout
    return {line.split()[3] for line in out.splitlines() if re.search(rf"\buid:{uid}\b", line)}


def attack(attacker: pwd.struct_passwd, victim: pwd.struct_passwd) -> list[str]:
    res = subprocess.run([PYTHON, "-c", ATTACK, str(victim.pw_uid)], cwd="/",
                         env=user_env(attacker), text=True, capture_output=True, timeout=120,
                         user=attacker.pw_uid, group=attacker.pw_gid, extra_groups=[])
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout.strip().splitlines()


def play(this: ThisNode, tmp: Path, victim: pwd.struct_passwd, attacker: pwd.struct_passwd,
         finish: bool = True) -> tuple[list[str], set[str], ShareExit | None]:
    """The victim's job runs; once its worker has joined the group (and the executor's loop
    has looked once more), the attacker tries every socket; then the job is let finish (or,
    not ``finish``, stopped: a job whose sockets another user used may wait for a gloo
    timeout)."""
    markers = tmp / "markers"
    spec, share, paths = torchrun_job(this, victim, tmp, "listen")
    shares = Shares(this)
    try:
        assert shares.start(spec, share, paths), store.read_text(paths.log(0))
        wait_until("the victim's worker", lambda: (shares.supervise(), (
            markers / "worker-started").exists())[1], timeout=90)
        time.sleep(listen_guard.SCAN_SECONDS)
        shares.supervise()
        listening = victims_listeners(victim.pw_uid)
        said = attack(attacker, victim)
        if not finish:
            return said, listening, None
        (markers / "release").write_text("")
        deadline = time.monotonic() + 90
        while paths.key in shares.running:
            assert time.monotonic() < deadline, "the share did not end"
            shares.supervise()
            time.sleep(0.1)
        paths.done.write_text("")
        return said, listening, store.read_record(paths.exit(0), ShareExit)
    finally:
        shares.stop_all("drill over")
        shares.guards.release_all()
        shares.listen.release_all()


def test_another_user_reaches_nothing_a_job_listens_on_and_the_job_finishes(
        node, victim, attacker, reachable_python):
    this, tmp = node
    said, listening, exit_record = play(this, tmp, victim, attacker)
    # the workers' store and gloo's listener at least, each tried and each reset
    assert len(listening) >= 2, listening
    assert len(said) >= len(listening), (said, listening)
    assert all(" refused " in line for line in said), said
    assert exit_record.returncode == 0, (exit_record, store.read_text(paths_log(tmp)))


def test_control_without_the_guard_another_user_writes_into_the_jobs_store(
        node, victim, attacker, reachable_python, monkeypatch):
    this, tmp = node
    monkeypatch.setattr(listen_guard.ListenGuard, "tick", lambda *_a, **_k: None)
    said, listening, _exit = play(this, tmp, victim, attacker, finish=False)
    assert len(listening) >= 2, listening
    assert any(line.endswith(" store-set") for line in said), said


def paths_log(tmp: Path) -> Path:
    """The victim's share log (for a failure's message)."""
    found = sorted((tmp / "efs" / "jobs").rglob("nodes/0*.log"))
    return found[0] if found else tmp / "no-log"


#: a task's server: listens on the node's address, says its port, waits to be stopped
SERVER = r'''
import socket, sys, time
s = socket.socket()
s.bind((sys.argv[1], 0))
s.listen()
print(s.getsockname()[1], flush=True)
time.sleep(120)
'''


def test_a_slurm_tasks_listener_is_kept_from_other_users_and_an_unmarked_one_is_not(
        node, victim, attacker, reachable_python):
    """What ``srun`` starts carries slurmstepd's ``SLURM_JOB_ID`` and ``SLURM_JOB_UID``: the
    node's executor guards such a task's sockets for the job's user (and Slurm's daemons,
    root) with no share of its own. The victim's second server, outside any job, stays open
    (the control)."""
    this, _tmp = node
    this.cluster.cluster_dir.mkdir(parents=True, exist_ok=True)
    base = dict(user_env(victim))
    servers = []
    try:
        for env in ({**base, "SLURM_JOB_ID": "17", "SLURM_JOB_UID": str(victim.pw_uid)}, base):
            servers.append(subprocess.Popen(
                [PYTHON, "-c", SERVER, this.address], env=env, cwd="/", text=True,
                stdout=subprocess.PIPE, user=victim.pw_uid, group=victim.pw_gid,
                extra_groups=[], start_new_session=True))
        in_job, outside = (int(p.stdout.readline()) for p in servers)
        guard = listen_guard.ListenGuard(this)
        guard.tick({}, now=1000.0)
        said = dict(line.split(" ", 1) for line in attack(attacker, victim))
        assert said[f"{this.address}:{in_job}"].startswith("refused"), said
        assert said[f"{this.address}:{outside}"] in ("open", "store-set"), said
        # Slurm's daemons (root) still reach it: slurmstepd tells srun its tasks' exits
        socket.create_connection((this.address, in_job), timeout=5).close()
        guard.release_all()  # its table goes (other executors of this machine's emulated
        # nodes guard the marked server too: one kernel, so the attack is not tried again)
        assert subprocess.run(["nft", "list", "table", "inet", listen_guard.table_name(
            this.address)], capture_output=True, check=False).returncode != 0
    finally:
        for p in servers:
            os.killpg(p.pid, 9)
            p.wait()
