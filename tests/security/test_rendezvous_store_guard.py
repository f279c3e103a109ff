"""Drill: another user writes a pickle into a running job's rendezvous store.

torch's dynamic rendezvous keeps its state, pickled, under ``torch.rendezvous.<id>`` in the
job's store and unpickles it at every sync of every agent (ten times a second in the agent's
monitor loop). The store serves any client, and the endpoint and id are in the agents' argv,
which ``/proc/*/cmdline`` shows to every user. A REAL unprivileged user (the attacker) reads
them there, connects and sets that key to a pickle whose reduce creates a marker file: the
agent that unpickles it runs the attacker's code as the job's user.

The victim's job is a real one-node torchrun job as ``dl-run`` plans it (the agent and the
``rdzv-store`` process), started by the real executor code (``Shares.start``, as root, the
share's processes as the victim), with no cluster boot. With the store guard the attacker's
connection is reset, no marker appears, and the job finishes; the control shows the same
attack without the guard does run code as the victim. The health gate's all-reduce (root's
job until it ran as its own user) has its drill in ``test_gate_store_guard.py``.

Needs root (real users, iptables, binding as root); CI runs as root.
"""

from __future__ import annotations

import pwd
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootstrap_scripts.jobs.executor import store_guard
from bootstrap_scripts.jobs.executor.node import ThisNode
from bootstrap_scripts.jobs.executor.shares import Shares
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.paths import JobPaths
from bootstrap_scripts.protocol.records import ShareExit
from emulator.nodes import PYTHON
from tests.security.conftest import user_env, wait_until
from tests.support.drill_node import drill_node, torchrun_job
from tests.support.pickle_attack import ATTACK, TRAIN

pytestmark = [pytest.mark.slow]


@pytest.fixture()
def node(victim) -> Iterator[tuple[ThisNode, Path]]:
    """A node root and an EFS of its own, every user able to reach them; a directory every
    user may write in for the markers."""
    with drill_node("dl-rdzv-guard-", 78, TRAIN) as found:
        yield found


def attack(attacker: pwd.struct_passwd, job_id: str, marker: Path) -> str:
    """The attacker's try, as that user: what it says (``set`` / ``refused ...``)."""
    res = subprocess.run([PYTHON, "-c", ATTACK, str(marker), job_id], cwd="/",
                         env=user_env(attacker), text=True, capture_output=True, timeout=60,
                         user=attacker.pw_uid, group=attacker.pw_gid, extra_groups=[])
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout.strip().splitlines()[-1]


def run_to_the_end(shares: Shares, paths: JobPaths, timeout: float = 60) -> ShareExit:
    """Supervise the share as the executor's loop does until its exit is recorded."""
    deadline = time.monotonic() + timeout
    while paths.key in shares.running:
        assert time.monotonic() < deadline, "the share did not end"
        shares.supervise()
        time.sleep(0.1)
    return store.read_record(paths.exit(0), ShareExit)


def play(this: ThisNode, tmp: Path, victim: pwd.struct_passwd, attacker: pwd.struct_passwd
         ) -> tuple[str, Path, ShareExit]:
    """The victim's job runs; once its worker runs, the attacker tries; then the job is let
    finish. (what the attacker saw, the marker its pickle would create, the share's exit)"""
    markers = tmp / "markers"
    pwned = markers / "pwned"
    spec, share, paths = torchrun_job(this, victim, tmp, "pickle")
    shares = Shares(this)
    try:
        assert shares.start(spec, share, paths), store.read_text(paths.log(0))
        wait_until("the victim's worker", (markers / "worker-started").exists, timeout=60)
        said = attack(attacker, "|" + spec.job_id, pwned)
        # the agents sync ten times a second: a second is plenty for the pickle to load
        time.sleep(1.5)
        (markers / "release").write_text("")
        ended = run_to_the_end(shares, paths)
        paths.done.write_text("")  # as the runner leaves it: the job is over
        wait_until("the guard's release", lambda: (shares.supervise(), not guarded(this))[1])
        return said, pwned, ended
    finally:
        shares.stop_all("drill over")
        shares.guards.release_all()


def guarded(this: ThisNode) -> bool:
    """Whether a store guard of this node is in the kernel."""
    listing = subprocess.run(["iptables", "-w", "-S", "OUTPUT"], capture_output=True,
                             text=True, check=True).stdout
    return f"{store_guard.COMMENT}:{this.address}:" in listing


def test_another_user_cannot_reach_a_jobs_store_and_the_job_finishes(
        node, victim, attacker, reachable_python):
    this, tmp = node
    said, pwned, exit_record = play(this, tmp, victim, attacker)
    assert said.startswith("refused"), said
    assert not pwned.exists()
    assert exit_record.returncode == 0, exit_record


def test_control_without_the_guard_the_pickle_runs_as_the_jobs_user(
        node, victim, attacker, reachable_python, monkeypatch):
    this, tmp = node
    monkeypatch.setattr(store_guard.StoreGuards, "guard", lambda *_a, **_k: "")
    said, pwned, exit_record = play(this, tmp, victim, attacker)
    assert said.startswith("set "), said
    assert pwned.exists()
    assert pwned.stat().st_uid == victim.pw_uid  # the attacker's code ran as the victim
    assert exit_record.returncode != 0, exit_record
