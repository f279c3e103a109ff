"""Elastic jobs on emulated nodes, driven the way the node agents drive them (protocol §7):
a newer membership generation that lists a new node makes its executor join the running
job; a drain request makes a node's executor stop its share and write ``.done``. Also the
executor's clean-up guarantees: workers die when torchrun dies first, and a restarted
executor stops a share it finds running without a recorded exit."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from bootstrap_scripts.node.procgroup import alive, pids_with_token, share_token
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.jobs import JobSpec
from bootstrap_scripts.protocol.paths import ClusterPaths, JobPaths, NodePaths
from bootstrap_scripts.protocol.records import (
    DrainDone,
    DrainRecord,
    JobResult,
    ShareStarted,
)
from tests.support.cluster import LocalCluster, free_rdzv_port
from tests.support.elastic_output import EPOCH_RE, FIRST_RE, START_RE, Lines

pytestmark = pytest.mark.slow
JOBS = Path(__file__).parent / "jobs"




def test_node_joins_and_drains_while_an_elastic_job_trains(emu):
    c = emu(3)
    master, w1, extra = c.addresses
    c.publish(1, [master, w1])
    NodePaths(c.roots[extra]).membership.unlink()  # not a member yet
    c.start_executors()
    p = c.popen_runner("--elastic", "--rdzv-port", free_rdzv_port(c), "--grace", "10", "--",
                       "-m", "bootstrap_scripts.examples.train_digits", "--epochs", "40",
                       "--checkpoint-every", "4", "--step-delay", "0.03",
                       "--require-acc", "0.95", "--name", "elastic")
    out = Lines(p)
    out.wait_for(EPOCH_RE, lambda m: m.group(5) == "2")

    # scale-out: generation 2 lists the new node; its executor joins the running job
    c.publish(2, [master, w1, extra])
    t_join, since = time.monotonic(), out.mark()
    out.wait_for(re.compile(r"^\[dl-run\] node (\d+) \((\S+)\) joined the job"),
                 lambda m: m.group(2) == extra, timeout=30, since=since)
    t_first, _ = out.wait_for(FIRST_RE, lambda m: m.group(2) == extra and m.group(4) == "3",
                              since=since)
    _, start3 = out.wait_for(START_RE, lambda m: m.group(3) == "3", since=since)
    assert start3.group(7) != "-", "the restart after the join did not resume"
    out.wait_for(EPOCH_RE, lambda m: m.group(5) == "3", since=since)

    # scale-in: the master agent's drain request names the new node
    now = time.time()
    c.drain(DrainRecord(
        instance_id="i-extra", address=extra, requested_at=now, deadline=now + 120,
        asg="workers", role="worker", lifecycle_hook="drain", lifecycle_action_token="t-1",
        member=True))
    t_drain, since = time.monotonic(), out.mark()
    out.wait_for(re.compile(r"^\[dl-run\] node \d+ \((\S+)\) left the job \(drained\)"),
                 lambda m: m.group(1) == extra, timeout=60, since=since)
    done_path = ClusterPaths(c.efs).drain_done("i-extra")
    _wait(lambda: store.exists(done_path), 10, "no .done")
    done = store.read_record(done_path, DrainDone)
    assert done and done.address == extra and done.requested_at == now
    c.publish(3, [master, w1])
    t_back, start2 = out.wait_for(START_RE, lambda m: m.group(3) == "2", since=since)
    assert int(start2.group(5)) > 0 and start2.group(7).startswith(("step-", "epoch-"))
    text = out.rest()
    assert p.wait(timeout=60) == 0, text
    print(f"\njoin: generation published -> first step on the new node "
          f"{t_first - t_join:.1f} s; drain: request -> training again without it "
          f"{t_back - t_drain:.1f} s")

    starts = [START_RE.match(line) for line in text.splitlines()]
    worlds = [int(m.group(3)) for m in starts if m]
    # consecutive duplicates: a restart at the same size (e.g. a slow first rendezvous)
    sizes = [w for i, w in enumerate(worlds) if i == 0 or worlds[i - 1] != w]
    assert sizes == [2, 3, 2], text
    steps = [int(m.group(5)) for m in starts if m]
    assert steps == sorted(steps), f"a restart went back in training: {steps}\n{text}"
    epochs = [EPOCH_RE.match(line) for line in text.splitlines()]
    epochs = [m for m in epochs if m]
    assert [int(m.group(3)) for m in epochs] == list(range(1, 41)), text
    assert float(text.split("final acc=")[1].split()[0]) >= 0.95
    (jdir,) = c.job_dirs()
    result = store.read_record(JobPaths(jdir).result, JobResult)
    assert result and result.status == "succeeded" and result.elastic
    by_addr = {n.address: n for n in result.nodes}
    assert by_addr[extra].joined and by_addr[extra].left
    assert by_addr[master].returncode == 0 and by_addr[w1].returncode == 0
    spec = JobSpec.from_json(store.read_text(JobPaths(jdir).spec) or "")
    assert spec.elastic and spec.generation == 1 and spec.join_template is not None
    assert "--nnodes=1:64" in spec.shares[0].procs[0].argv


def _share_ready(c: LocalCluster) -> bool:
    """The sleeper job printed "ready" on node rank 0."""
    return any("ready" in (store.read_text(JobPaths(d).log(0)) or "") for d in c.job_dirs())


def _wait(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[1])


def test_workers_die_when_torchrun_dies_first(emu):
    c = emu(1)
    c.start_executors()
    p = c.popen_runner("--rdzv-port", free_rdzv_port(c), "--", str(JOBS / "sleeper.py"))
    _wait(lambda: _share_ready(c), 90, "the sleeper never got ready")
    (jdir,) = c.job_dirs()
    token = share_token(JobPaths(jdir).key, 0, c.addresses[0])
    workers = [pid for pid in pids_with_token(token) if alive(pid)]
    wrapper = store.read_record(JobPaths(jdir).started(0), ShareStarted).pids[0]
    # the share's first process is torchrun's wrapper (jobs/share_wrapper.py): its child
    (torchrun,) = [pid for pid in workers if _parent(pid) == wrapper]
    assert len(workers) >= 3  # torchrun, its worker, the worker's child
    os.kill(torchrun, signal.SIGKILL)  # the workers live in sessions of their own
    _wait(lambda: store.exists(JobPaths(jdir).exit(0)), 30, "no exit recorded")
    assert not [pid for pid in workers if alive(pid)]
    assert p.wait(timeout=30) == 1
