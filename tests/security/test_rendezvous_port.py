"""Drill: another user squats a job's rendezvous port before the job starts (was F8).

A REAL unprivileged user (the attacker) listens where a torchrun job's rendezvous store
will be, before the victim's job starts on the master; the master's share is started by the
real executor code (``Shares.start``, as root, the share's processes as the victim), with no
cluster boot. Every agent of a job connects to ``<master>:<--rdzv-port>``: whoever listens
there sees the job's rendezvous and can steer it.

- At the default port (the rendezvous window, privileged) the attacker cannot even bind,
  and the job's store is served on the socket root bound for it.
- At a port the victim chose above 1024, the attacker can bind first: the master's share
  is then refused at once, naming the address, the port and the attacker's uid and pid,
  and no process of the share starts (the agent never meets the attacker's socket).

Needs root (real users, binding as root); CI runs as root.
"""

from __future__ import annotations

import os
import pwd
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootstrap_scripts.jobs.engine import launchers as ln
from bootstrap_scripts.jobs.engine import user_dirs
from bootstrap_scripts.jobs.engine.plan_types import LaunchOptions
from bootstrap_scripts.jobs.engine.rdzv_store import RDZV_STORE_LABEL
from bootstrap_scripts.jobs.executor.listeners import holders
from bootstrap_scripts.jobs.executor.node import ThisNode
from bootstrap_scripts.jobs.executor.shares import Shares
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.jobs import DEFAULT_RDZV_PORT, JobSpec, Proc, Share
from bootstrap_scripts.protocol.membership import build_membership
from bootstrap_scripts.protocol.paths import JobPaths
from bootstrap_scripts.protocol.records import ShareStarted
from emulator.nodes import PYTHON
from tests.security.conftest import as_user, user_env, wait_until
from tests.support.drill_node import drill_node

pytestmark = [pytest.mark.slow]

#: What the attacker runs: listen on argv[1]:argv[2], say so, hold it.
SQUAT = """
import socket, sys, time
s = socket.socket()
try:
    s.bind((sys.argv[1], int(sys.argv[2])))
except OSError as exc:
    print("refused", exc.errno, flush=True)
    sys.exit(0)
s.listen()
print("listening", flush=True)
time.sleep(120)
"""


#: A client of the store at argv[1]:argv[2]: set a key, read it back.
CLIENT = """
import sys
from datetime import timedelta
from torch.distributed import TCPStore
client = TCPStore(sys.argv[1], int(sys.argv[2]), is_master=False, timeout=timedelta(seconds=30))
client.set("drill", "mine")
print(client.get("drill").decode())
"""


@pytest.fixture()
def node(victim) -> Iterator[tuple[ThisNode, Path]]:
    """A node root and an EFS of its own, every user able to reach them."""
    with drill_node("dl-rdzv-", 77) as found:
        yield found


def victims_job(this: ThisNode, user: pwd.struct_passwd, port: int, marker: Path
                ) -> tuple[JobSpec, Share, JobPaths]:
    """The victim's torchrun job on a one-node membership, as ``dl-run`` plans it: its
    master's share is the agent (here a stand-in that only leaves ``marker``: did the agent
    start?) and the real rendezvous store with its listener."""
    m = build_membership(cluster_id="drill", generation=1, efs_mount=str(this.cluster.efs),
                         reason="drill", master={"instance_id": "i-0", "address": this.address,
                                                 "gpus": 0}, workers=[])
    opts = LaunchOptions(job_id="rdzv-drill", python=PYTHON, rdzv_port=port)
    agent = Proc(argv=(PYTHON, "-c", f"open({str(marker)!r}, 'w'); import time; "
                       "time.sleep(60)"))
    share = Share(0, this.address, (agent, ln.rdzv_store_proc(opts, m)))
    spec = JobSpec(job_id="rdzv-drill", launcher="torchrun", shares=(share,), cwd="/",
                   grace_seconds=1.0, env={"PATH": os.environ["PATH"]})
    user_dirs.ensure(this.cluster.efs, {user.pw_name: (user.pw_uid, user.pw_gid)})
    paths = this.cluster.job(spec.job_id, user.pw_name)
    paths.dir.mkdir()
    os.chown(paths.dir, user.pw_uid, user.pw_gid)
    paths.spec.write_text(spec.to_json())
    os.chown(paths.spec, user.pw_uid, user.pw_gid)
    os.chmod(paths.spec, 0o600)
    return JobSpec.from_json(paths.spec.read_text()), share, paths


def squat(attacker: pwd.struct_passwd, host: str, port: int) -> tuple[subprocess.Popen, str]:
    """The attacker's process trying to listen on host:port: (process, what it says)."""
    p = subprocess.Popen([PYTHON, "-c", SQUAT, host, str(port)], cwd="/",
                         env=user_env(attacker), text=True, stdout=subprocess.PIPE,
                         user=attacker.pw_uid, group=attacker.pw_gid, extra_groups=[],
                         start_new_session=True)
    return p, p.stdout.readline().strip()


def stop(p: subprocess.Popen) -> None:
    p.kill()
    p.wait()
    p.stdout.close()


def free_unprivileged_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def stop_shares(shares: Shares) -> None:
    shares.stop_all("drill over")
    shares.guards.release_all()  # no runner marks the job done here


def test_a_user_cannot_take_the_default_rendezvous_port_and_the_job_is_served_by_its_own_store(
        node, victim, attacker, reachable_python, tmp_path):
    this, tmp = node
    p, said = squat(attacker, this.address, DEFAULT_RDZV_PORT)
    marker = tmp / "markers" / "agent-started"
    shares = Shares(this)
    try:
        if not window_is_privileged():
            # A kernel that lets users bind low ports (some containers lower
            # ip_unprivileged_port_start): the window is then as good as a port above
            # 1024, and the squatter must be refused by name all the same.
            assert said == "listening", said
            refused_naming(shares, *victims_job(this, victim, DEFAULT_RDZV_PORT, marker),
                           attacker, p, this.address, DEFAULT_RDZV_PORT)
            return
        assert said == "refused 13", said  # EACCES: only root binds the rendezvous window
    finally:
        stop(p)
        stop_shares(shares)
    spec, share, paths = victims_job(this, victim, DEFAULT_RDZV_PORT, marker)
    try:
        assert shares.start(spec, share, paths)
        # the job's own user reaches it (no one else does: test_rendezvous_store_guard.py)
        res = as_user(victim, CLIENT, this.address, str(DEFAULT_RDZV_PORT))
        assert res.stdout.strip() == "mine", res.stdout + res.stderr
        # the one socket listening there is root's, held by the victim's store alone
        (held,) = holders(this.address, DEFAULT_RDZV_PORT)
        store_pid = shares.running[paths.key].procs[1].popen.pid
        owners = dict(held.processes)
        assert set(owners.values()) == {victim.pw_uid}, held
        assert store_pid not in owners  # the wrapper (root) kept no copy; its child has it
        wait_until("the agent", marker.exists)
    finally:
        stop_shares(shares)
    assert paths.log(0, RDZV_STORE_LABEL).read_text() == ""


def test_a_squatted_port_refuses_the_masters_share_naming_the_holder(
        node, victim, attacker, reachable_python):
    this, tmp = node
    port = free_unprivileged_port(this.address)
    p, said = squat(attacker, this.address, port)
    marker = tmp / "markers" / "agent-started"
    shares = Shares(this)
    try:
        assert said == "listening", said
        refused_naming(shares, *victims_job(this, victim, port, marker), attacker, p,
                       this.address, port)
        assert not marker.exists()
    finally:
        stop(p)
        stop_shares(shares)


def refused_naming(shares: Shares, spec: JobSpec, share: Share, paths: JobPaths,
                   attacker: pwd.struct_passwd, squatter: subprocess.Popen, host: str,
                   port: int) -> None:
    """The master's share is refused at once, naming the port and the squatter, and
    nothing of it starts: no agent of the job meets the squatter's socket."""
    assert not shares.start(spec, share, paths)
    rec = store.read_record(paths.started(0), ShareStarted)
    assert f"cannot listen on {host}:{port}" in rec.error, rec
    assert f"uid {attacker.pw_uid} ({attacker.pw_name})" in rec.error, rec
    assert f"pid {squatter.pid} " in rec.error, rec
    assert rec.pids == (), rec
    assert rec.error in paths.log(0).read_text()


def window_is_privileged() -> bool:
    """Whether only root may bind the rendezvous window here (ip(7))."""
    start = Path("/proc/sys/net/ipv4/ip_unprivileged_port_start").read_text()
    return int(start) > DEFAULT_RDZV_PORT
