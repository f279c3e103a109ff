"""The store guard's rules (``executor/store_guard.py``): their exact shape, and what the
executor does with the kernel's OUTPUT chain (real ``iptables``: needs root, as CI runs).

Each test guards an address of its own on the loopback network, and takes every rule it
made away again.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from bootstrap_scripts.jobs.executor import store_guard as sg
from bootstrap_scripts.jobs.executor.node import ThisNode
from bootstrap_scripts.protocol.jobs import JobSpec, Listener, Proc, Share
from bootstrap_scripts.protocol.paths import ClusterPaths, NodePaths


def test_the_rule_resets_every_uid_but_the_jobs_at_the_store_endpoint():
    words = sg.rule(sg.Endpoint("10.0.0.5", 294), 1001, "dl-store-guard:10.0.0.6:alice/j")
    assert words == ["-d", "10.0.0.5/32", "-p", "tcp", "--dport", "294", "-m", "owner", "!",
                     "--uid-owner", "1001", "-m", "comment", "--comment",
                     "dl-store-guard:10.0.0.6:alice/j", "-j", "REJECT", "--reject-with",
                     "tcp-reset"]


def test_only_the_products_guards_are_read_back_from_a_listing():
    listing = (
        "-P OUTPUT ACCEPT\n"
        "-A OUTPUT -d 169.254.169.254/32 -p tcp -m tcp --dport 80 -m owner ! --uid-owner 0 "
        "-m comment --comment dl-imds-root-only -j REJECT --reject-with tcp-reset\n"
        "-A OUTPUT -d 10.0.0.5/32 -p tcp -m tcp --dport 294 -m owner ! --uid-owner 1001 "
        '-m comment --comment "dl-store-guard:10.0.0.6:alice/j" -j REJECT '
        "--reject-with tcp-reset\n"
        "-A OUTPUT -m comment --comment\n"
        '-A OUTPUT -m comment --comment "unbalanced\n')
    (found,) = sg.listed_guards(listing)
    assert sg.guards_endpoint(found, sg.Endpoint("10.0.0.5", 294))
    assert not sg.guards_endpoint(found, sg.Endpoint("10.0.0.5", 295))
    assert sg.word_after(found, "--comment") == "dl-store-guard:10.0.0.6:alice/j"


def torchrun_spec(job_id: str, host: str, port: int) -> JobSpec:
    store = Proc(argv=("python", "rdzv_store.py"), label="rdzv-store", wait=False,
                 listen=Listener(host=host, port=port))
    return JobSpec(job_id=job_id, launcher="torchrun",
                   shares=(Share(0, host, (Proc(argv=("torchrun",)), store)),))


def test_a_job_without_a_listener_has_nothing_to_guard():
    spec = JobSpec(job_id="e", launcher="each", shares=(Share(0, "10.0.0.5",
                                                              (Proc(argv=("true",)),)),))
    assert sg.endpoint(spec) is None
    assert sg.endpoint(torchrun_spec("t", "10.0.0.5", 300)) == sg.Endpoint("10.0.0.5", 300)


def listed(host: str) -> list[list[str]]:
    out = subprocess.run(["iptables", "-w", "-S", "OUTPUT"], capture_output=True, text=True,
                         check=True).stdout
    return [w for w in sg.listed_guards(out) if sg.word_after(w, "-d") == f"{host}/32"]


@pytest.fixture()
def efs(tmp_path) -> ClusterPaths:
    if os.geteuid() != 0:
        pytest.skip("iptables needs root")
    return ClusterPaths(tmp_path / "efs")


def address() -> str:
    return f"127.79.{os.getpid() % 250 + 1}.{int(time.time() * 1000) % 250 + 1}"


def test_a_guard_replaces_another_jobs_left_behind_and_goes_when_the_job_is_done(efs):
    host = address()
    node_a = sg.StoreGuards(ThisNode(NodePaths(Path("/a")), efs, "127.79.0.1"))
    node_b = sg.StoreGuards(ThisNode(NodePaths(Path("/b")), efs, "127.79.0.2"))
    old, new = efs.job("old", "alice"), efs.job("new", "bob")
    try:
        node_a.guard(torchrun_spec("old", host, 294), old, 1001)
        node_a.held.clear()  # its executor died: the rule stays behind in the kernel
        node_a.guard(torchrun_spec("new", host, 294), new, 1002)
        node_b.guard(torchrun_spec("new", host, 294), new, 1002)
        rules = listed(host)
        # the dead job's guard is gone, the new job's is there once per node
        assert sorted(sg.word_after(w, "--comment") for w in rules) == [
            f"dl-store-guard:127.79.0.1:{new.key}", f"dl-store-guard:127.79.0.2:{new.key}"]
        assert {sg.word_after(w, "--uid-owner") for w in rules} == {"1002"}
        assert node_a.guard(torchrun_spec("new", host, 294), new, 1002).endswith(
            "already guarded for uid 1002")
        assert len(listed(host)) == 2
        # a job still running here keeps its guard; once done and not running, it goes
        new.dir.mkdir(parents=True)
        new.done.write_text("")
        node_a.tick({new.key}, time.monotonic() + 10)
        assert len(listed(host)) == 2
        node_a.tick(set(), time.monotonic() + 20)
        assert [sg.word_after(w, "--comment") for w in listed(host)] == [
            f"dl-store-guard:127.79.0.2:{new.key}"]
        # a machine that goes takes its rules along (the emulator's one kernel: forget)
        node_b.held.clear()
        assert sg.forget("127.79.0.2") == 1
        assert listed(host) == []
    finally:
        for words in listed(host):
            subprocess.run(["iptables", "-w", "-D", "OUTPUT", *words], check=False)


def test_a_root_job_is_guarded_for_root(efs):
    host = address()
    guards = sg.StoreGuards(ThisNode(NodePaths(Path("/a")), efs, "127.79.0.1"))
    try:
        assert guards.guard(torchrun_spec("r", host, 295), efs.job("r", "root"), -1) == \
            f"{host}:295 guarded for uid 0"
    finally:
        guards.release_all()
    assert listed(host) == []


def test_a_node_without_a_share_guards_the_store_until_the_job_is_done(tmp_path):
    """Every node's connections leave through its own kernel: an executor guards the store
    of every torchrun job it reads, with a share of it or not (``discovery.consider``)."""
    if os.geteuid() != 0:
        pytest.skip("iptables needs root")
    from bootstrap_scripts.jobs.executor.daemon import Executor
    from bootstrap_scripts.protocol import store

    host, here = address(), "127.79.250.9"
    ex = Executor(tmp_path / "node", tmp_path / "efs", here)
    paths = ex.node.cluster.job("elsewhere")
    try:
        ex.step()
        store.atomic_write(paths.spec, torchrun_spec("elsewhere", host, 296).to_json())
        ex.step()
        assert paths.key not in ex.shares.running  # nothing of it runs here
        (rule,) = listed(host)
        assert sg.word_after(rule, "--comment") == f"dl-store-guard:{here}:{paths.key}"
        assert sg.word_after(rule, "--uid-owner") == "0"  # root's job: root alone
        store.atomic_write(paths.done, "succeeded\n")
        deadline = time.monotonic() + 10
        while listed(host) and time.monotonic() < deadline:
            ex.step()
            time.sleep(0.2)
        assert listed(host) == []
    finally:
        ex.shares.stop_all("test over")
        ex.shares.guards.release_all()
        for words in listed(host):
            subprocess.run(["iptables", "-w", "-D", "OUTPUT", *words], check=False)
