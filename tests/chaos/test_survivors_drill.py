"""Training through a lost worker: an elastic managed job keeps training on the survivors and
grows back when the replacement has passed the controller's gate, against today's
wait-for-the-replacement policy of a job that is not elastic.

Real processes on the emulator's loopback nodes (``tests.support.cluster``): 4 nodes, the
job on 3 (master and two workers); the example job (``train_digits``, torchrun, CPU/gloo)
managed by the master's job controller (Auto Scaling calls against moto's server, as in
tests/jobs/test_node_fault.py). A worker is lost as a machine is (its executor and its share
killed, ``Node.kill``). The replacement's boot is emulated: the fourth node, executor
already running, enters the membership ``BOOT_DELAY`` seconds after the kill (as the master
agent publishes a node that booted, registered and prepared; on AWS that is minutes). The
controller runs without the health gate (executor-only nodes have no GPU tools): its
admission of the replacement still happens, with an empty gate.

``chaos``: the drill (one row of ``make chaos``'s table). ``bench``: both policies, the
figure printed (``make bench``). Timings are this 2-core machine's, torch imports included.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.managed_records import ManagedJob
from bootstrap_scripts.protocol.paths import ClusterPaths, NodePaths
from bootstrap_scripts.protocol.records import ShareStarted
from emulator.resources import create_cluster
from tests.chaos.drills import drill, wait_for
from tests.conftest import REGION
from tests.support.cluster import free_rdzv_port
from tests.support.elastic_output import START_RE, Lines

#: the replacement's emulated boot (AWS: minutes; kept short so the drill stays short)
BOOT_DELAY = 20.0
EPOCHS = 20


@dataclass
class Run:
    job: ManagedJob
    text: str
    kill_to_training: float  # worker killed -> first (re)start line on the survivors
    kill_to_full: float  # worker killed -> training again on 3 nodes
    admitted: bool  # the controller admitted the replacement (elastic)


def managed_job_id(efs: Path) -> str:
    (job_dir,) = [d for d in (efs / "managed").glob("*/*") if d.is_dir()]  # <user>/<id>
    return job_dir.name


def lose_worker_and_replace(emu, moto: str, *, elastic: bool) -> Run:
    res = create_cluster(moto, cluster_id="survivors" + ("-e" if elastic else ""), workers=3)
    c = emu(4, instances=res.node_instances("master") + res.node_instances("worker"))
    master, w1, w2, spare = c.addresses
    c.publish(1, [master, w1, w2])
    NodePaths(c.roots[spare]).membership.unlink()  # booting: not a member yet
    c.start_executors()
    c.start_controller({"AWS_ENDPOINT_URL": moto, "AWS_ACCESS_KEY_ID": "testing",
                        "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": REGION,
                        "AWS_DEFAULT_REGION": REGION})
    p = c.popen_runner(*(("--elastic",) if elastic else ()), "--rdzv-port", free_rdzv_port(c),
                       "--fail-grace", "1", "--min-nodes", "2", "--replace-timeout", "600",
                       "--", "-m", "bootstrap_scripts.examples.train_digits", "--epochs",
                       str(EPOCHS), "--checkpoint-every", "4", "--step-delay", "0.2",
                       "--require-acc", "0.9", managed=True)
    out = Lines(p)
    out.wait_for(re.compile(r"^\[\d+ \S+\] epoch=2 "), timeout=240)
    job_id = managed_job_id(c.efs)
    attempt = ClusterPaths(c.efs).job(f"{job_id}.1")
    started = [rec for _s, rec in store.scan_records(attempt.nodes, ShareStarted,
                                                     suffix=".started")]
    (lost,) = [r for r in started if r.address == w2]
    since = out.mark()
    c.node(w2).kill([lost.pgid])
    t_kill = time.monotonic()
    t_train = None
    if elastic:  # training again on the 2 survivors, before any replacement exists
        t_train, _ = out.wait_for(START_RE, lambda m: int(m.group(3)) == 2, timeout=240,
                                  since=since)
    wait_for("the replacement's boot", lambda: time.monotonic() - t_kill >= BOOT_DELAY,
             timeout=BOOT_DELAY + 240)
    c.publish(2, [master, w1, spare], "w2 lost; its replacement registered")
    t_full, _ = out.wait_for(START_RE, lambda m: int(m.group(3)) == 3, timeout=300,
                             since=out.mark() if elastic else since)
    t_train = t_full if t_train is None else t_train
    text = out.rest()
    assert p.wait(timeout=300) == 0, text[-4000:]
    job = store.read_record(ClusterPaths(c.efs).managed(job_id).record, ManagedJob)
    admitted = any(store.exists(ClusterPaths(c.efs).job(f"{job_id}.{n}").admitted(spare))
                   for n in range(1, job.attempt + 1))
    c.stop()  # before the next cluster: two clusters never load this machine together
    return Run(job, text, round(t_train - t_kill, 1), round(t_full - t_kill, 1), admitted)


@pytest.mark.chaos
def test_an_elastic_managed_job_trains_through_a_lost_worker(emu, moto_reset):
    with drill("(m) elastic: train through a loss", "kill -9 of every process of a worker "
               f"of an elastic managed job (3 of 4 nodes); replacement after {BOOT_DELAY:.0f} "
               "s (emulated boot)") as row:
        run = lose_worker_and_replace(emu, moto_reset, elastic=True)
        row.seconds = run.kill_to_training
        row.did = (f"{run.job.state}: training again on 2 nodes {run.kill_to_training} s after "
                   f"the kill; the replacement admitted by the controller, back on 3 nodes "
                   f"{run.kill_to_full} s after it")
        row.check("record", run.job.state == "succeeded", json.dumps(run.job.message))
        row.check("survivors before the replacement", run.kill_to_training < BOOT_DELAY,
                  f"{run.kill_to_training} s")
        row.check("admitted", run.admitted)
        row.check("grew back", run.kill_to_full >= BOOT_DELAY, f"{run.kill_to_full} s")


@pytest.mark.bench
def test_bench_training_again_on_the_survivors_vs_waiting_for_the_replacement(emu,
                                                                              moto_reset):
    waiting = lose_worker_and_replace(emu, moto_reset, elastic=False)
    elastic = lose_worker_and_replace(emu, moto_reset, elastic=True)
    assert waiting.job.state == elastic.job.state == "succeeded"
    print(f"\nworker killed -> training again (real processes: executors, job controller, "
          f"torchrun, train_digits on CPU; the replacement's boot emulated as {BOOT_DELAY:.0f} "
          f"s; this 2-core machine)")
    print(f"{'policy':48} {'training again':>15} {'back on 3 nodes':>16}")
    print(f"{'not elastic: wait for the replacement':48} {waiting.kill_to_training:>13.1f} s "
          f"{waiting.kill_to_full:>14.1f} s")
    print(f"{'elastic: survivors at once, replacement joins':48} "
          f"{elastic.kill_to_training:>13.1f} s {elastic.kill_to_full:>14.1f} s")
