"""Drill: a cluster user writes a pickle into the health gate's all-reduce store.

The gate's all-reduce is a torchrun job across the nodes that the job controller (root)
runs before every attempt. A REAL unprivileged user (the attacker) watches ``/proc`` for its
agents, reads the store endpoint and the rendezvous id from their argv and sets
``torch.rendezvous.<id>`` to a pickle whose reduce creates a marker (the attack of
``tests/support/pickle_attack.py``). When the collective ran as root, the marker was root's,
on every node, and the gate failed every node.

Now the collective runs as the gate's own system user (``jobs.engine.gate_identity``) and
its store is guarded for that user alone (``executor/store_guard.py``): the attacker's
connection is reset, no marker appears, every node passes the all-reduce, and the job was
the gate user's. A two-node emulated cluster (real executors as root, real torchrun over
gloo) in a directory every user can reach.

Needs root (real users, iptables, useradd); CI runs as root.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootstrap_scripts.jobs.engine import gate_identity
from bootstrap_scripts.ops import gate
from bootstrap_scripts.ops import gate_report as gr
from emulator.nodes import PYTHON
from tests.security.conftest import user_env
from tests.support.cluster import LocalCluster, free_rdzv_port
from tests.support.pickle_attack import ATTACK
from tests.support.users import cluster_for_users

pytestmark = [pytest.mark.slow]


@pytest.fixture()
def gate_cluster(attacker, reachable_python) -> Iterator[LocalCluster]:
    """Two nodes whose executors run as root, the gate's user made as the installer makes
    it on every node."""
    gate_identity.ensure()
    with cluster_for_users("dl-gate-drill-", 2) as c:
        c.start_executors()
        yield c


@pytest.fixture()
def markers() -> Iterator[Path]:
    tmp = Path(tempfile.mkdtemp(prefix="dl-gate-markers-"))
    os.chmod(tmp, 0o1777)
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_a_user_cannot_feed_the_gates_all_reduce_a_pickle(gate_cluster, attacker, markers):
    c = gate_cluster
    m = c.membership
    s = gr.GateSettings(rdzv_port=int(free_rdzv_port(c)), allreduce_mib=1,
                        allreduce_iters=20)
    pwned = markers / "pwned"
    wanted = f"{m.master_addr}:{s.rdzv_port}|health-allreduce"
    spy = subprocess.Popen([PYTHON, "-c", ATTACK, str(pwned), wanted], cwd="/",
                           env=user_env(attacker), text=True, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, user=attacker.pw_uid,
                           group=attacker.pw_gid, extra_groups=[], start_new_session=True)
    said: list[str] = []
    try:
        rows = {n.address: gr.NodeReport(n) for n in m.nodes}
        report = gr.GateReport(list(rows.values()), settings=s)
        gate.run_allreduce(c.master_root, c.efs, m, list(m.nodes), rows, s,
                           time.monotonic() + 300, report, said.append)
        out, _ = spy.communicate(timeout=60)
    finally:
        if spy.poll() is None:
            spy.kill()
            spy.communicate()
    assert not pwned.exists(), f"the attacker's pickle ran as uid {pwned.stat().st_uid}"
    assert out.strip().splitlines()[-1].startswith("refused"), out
    assert said == [], said  # the gate's user could run it: not root
    for row in rows.values():
        assert row.cells["allreduce"].status == gr.OK, row.cells["allreduce"]
    (job_dir,) = [d for d in c.job_dirs() if d.name.startswith("health-allreduce")]
    assert job_dir.parent.name == gate_identity.NAME
    assert job_dir.stat().st_uid == gate_identity.lookup().pw_uid
