"""Spare nodes of an elastic job (docs/elastic-training.md, "Spare nodes"), with real
processes on the emulator's loopback nodes: executors, ``dl-run``, torchrun agents, the
example job on CPU/gloo.

Four members, ``--elastic --nnodes 1:3``: three nodes train, one waits on torchrun's
redundancy list. A participant's machine is lost (``Node.kill``: its executor and its
share, SIGKILL); the next round takes the spare and the job trains on at three nodes, never
two. Then a fifth node enters the membership and joins the job: the round is full, so it
becomes the new spare and nobody restarts. At the end every share exits 0: the new spare's
agent leaves through ``torchrun_agent.py``'s mend (without it torch 2.13's agent exits 1
and the job is reported failed)."""

from __future__ import annotations

import re
import time

import pytest

from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.jobs import JobSpec
from bootstrap_scripts.protocol.paths import JobPaths, NodePaths
from bootstrap_scripts.protocol.records import JobResult, ShareStarted
from tests.support.cluster import free_rdzv_port
from tests.support.elastic_output import EPOCH_RE, FIRST_RE, START_RE, Lines

pytestmark = pytest.mark.slow
EPOCHS = 30
JOINED_RE = re.compile(r"^\[dl-run\] node (\d+) \((\S+)\) joined the job")


def round_members(out: Lines, world: int, since: int) -> set[str]:
    """The addresses whose ranks took a first step in a round of ``world`` ranks after line
    ``since`` (every rank prints ``first_step``; one rank per node here)."""
    members: set[str] = set()

    def more(m: re.Match) -> bool:
        if m.group(4) == str(world):
            members.add(m.group(2))
        return len(members) >= world

    out.wait_for(FIRST_RE, more, timeout=180, since=since)
    return members


def test_a_spare_takes_a_lost_node_s_place_and_a_late_node_waits_as_a_spare(emu):
    c = emu(5)
    master, w1, w2, w3, late = c.addresses
    c.publish(1, [master, w1, w2, w3])
    NodePaths(c.roots[late]).membership.unlink()  # not a member yet
    c.start_executors()
    p = c.popen_runner("--elastic", "--nnodes", "1:3", "--rdzv-port", free_rdzv_port(c),
                       "--grace", "10", "--", "-m", "bootstrap_scripts.examples.train_digits",
                       "--epochs", str(EPOCHS), "--checkpoint-every", "4", "--step-delay",
                       "0.05", "--require-acc", "0.9", "--name", "spares")
    out = Lines(p)
    first = round_members(out, 3, 0)
    (spare,) = {master, w1, w2, w3} - first
    out.wait_for(EPOCH_RE, lambda m: m.group(3) == "2")

    # a participant other than the master is lost, as a machine is
    victim = sorted(first - {master})[0]
    (jdir,) = c.job_dirs()
    spec = JobSpec.from_json(store.read_text(JobPaths(jdir).spec) or "")
    assert spec.nnodes == "1:3"  # the range the controller's hang watch reads back
    pgids = [rec.pgid for _s, rec in store.scan_records(JobPaths(jdir).nodes, ShareStarted,
                                                        suffix=".started")
             if rec.address == victim]
    since = out.mark()
    c.node(victim).kill(pgids)
    t_kill = time.monotonic()
    t_again, start = out.wait_for(START_RE, since=since, timeout=180)
    assert start.group(3) == "3", f"the round after the loss has {start.group(3)} ranks"
    second = round_members(out, 3, since)
    assert spare in second and victim not in second, (spare, victim, second)
    sizes = {m.group(4) for _t, line in out.all[since:] if (m := FIRST_RE.match(line))}
    assert sizes == {"3"}, f"rounds of {sizes} ranks after the loss"
    out.wait_for(EPOCH_RE, lambda m: m.group(5) == "3", since=since)

    # the replacement: it joins a full round, so it waits as the new spare
    c.publish(2, [a for a in c.addresses if a != victim])
    _t, joined = out.wait_for(JOINED_RE, lambda m: m.group(2) == late, timeout=60,
                              since=out.mark())
    after_join = out.mark()
    text = out.rest()
    assert p.wait(timeout=120) == 0, text[-4000:]
    later = text.splitlines()[after_join:]
    restarts = [line for line in later if START_RE.match(line) or FIRST_RE.match(line)]
    assert not restarts, f"the late node's join restarted the job: {restarts}"
    epochs = [int(m.group(3)) for m in map(EPOCH_RE.match, text.splitlines()) if m]
    assert epochs[-1] == EPOCHS, epochs
    result = store.read_record(JobPaths(jdir).result, JobResult)
    assert result and result.status == "succeeded", text[-4000:]
    by_addr = {n.address: n for n in result.nodes}
    assert by_addr[late].joined and by_addr[late].returncode == 0, by_addr[late]
    assert by_addr[spare].returncode == 0 and by_addr[master].returncode == 0
    assert "1 spare node(s)" in text
    late_log = store.read_text(JobPaths(jdir).log(int(joined.group(1)))) or ""
    assert "was a spare" in late_log, late_log[-2000:]
    print(f"\nspare: participant killed -> training again on 3 nodes "
          f"{t_again - t_kill:.1f} s (this 2-core machine)")
