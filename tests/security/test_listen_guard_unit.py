"""The listener guard's parts (``jobs/executor/listen_guard.py``): reading ``/proc/net/tcp``,
telling a share's sockets from others', what each node keeps others from, the nftables
transaction (applied to the real kernel here, as root), and two nodes' executors passing
their jobs' listeners to each other through EFS."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from bootstrap_scripts.jobs.executor import listen_guard as lg
from bootstrap_scripts.jobs.executor import listen_sockets as ls
from bootstrap_scripts.jobs.executor.node import ThisNode
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.membership import build_membership
from bootstrap_scripts.protocol.paths import ClusterPaths, NodePaths
from bootstrap_scripts.protocol.records import Listening, NodeListeners

HEADER = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  "
          "timeout inode\n")


def tcp_line(local: str, state: str, uid: int, inode: int) -> str:
    return (f"   0: {local} 00000000:0000 {state} 00000000:00000000 00:00000000 00000000 "
            f"{uid:>5}        0 {inode} 1 0000000000000000 100 0 0 10 0\n")


def test_only_listening_sockets_are_read_with_their_address_port_uid_and_inode():
    text = HEADER + tcp_line("0100007F:1F90", "0A", 1001, 111) + \
        tcp_line("0100007F:1F91", "01", 1001, 112) + "garbage line\n" + \
        tcp_line("0400000A:0050", "0A", 0, 113)
    assert ls.parse_proc_net(text) == [ls.Socket("127.0.0.1", 8080, 1001, 111),
                                       ls.Socket("10.0.0.4", 80, 0, 113)]
    six = HEADER + tcp_line("00000000000000000000000000000000:1F90", "0A", 7, 9) + \
        tcp_line("0000000000000000FFFF00000400000A:0050", "0A", 7, 10)
    assert ls.parse_proc_net(six) == [ls.Socket("::", 8080, 7, 9),
                                      ls.Socket("::ffff:a00:4", 80, 7, 10)]


def test_a_wildcard_is_the_nodes_address_and_its_loopback_a_mapped_address_its_ipv4():
    assert ls.reachable_as("0.0.0.0", "10.0.0.4") == ["10.0.0.4", "127.0.0.1"]
    assert ls.reachable_as("::", "10.0.0.4") == ["10.0.0.4", "127.0.0.1", "::1"]
    assert ls.reachable_as("::ffff:10.0.0.4", "10.0.0.4") == ["10.0.0.4"]
    assert ls.reachable_as("127.0.0.1", "10.0.0.4") == ["127.0.0.1"]


def test_another_nodes_record_counts_only_for_a_member_and_at_its_own_address():
    own = {Listening("127.0.0.1", 5, 1001)}
    b = NodeListeners(address="10.0.0.5", seq=1, listening=(
        Listening("10.0.0.5", 6, 1002), Listening("10.0.0.4", 7, 1002),  # not its address
        Listening("127.0.0.1", 8, 1002)))  # its loopback: not reachable from here
    c = NodeListeners(address="10.0.0.6", seq=1, listening=(Listening("10.0.0.6", 9, 1003),))
    got = lg.wanted(own, {"10.0.0.5": b, "10.0.0.6": c}, ["10.0.0.5"])  # c left the cluster
    assert got == {Listening("127.0.0.1", 5, 1001), Listening("10.0.0.5", 6, 1002)}


def test_names_carry_the_address_and_sequence_and_the_latest_wins():
    assert lg.parse_name("10.0.0.4.17.json") == ("10.0.0.4", 17)
    for bad in ("10.0.0.4.json", "x.1.json", "10.0.0.4.1.json.tmp", "../1.2.json"):
        assert lg.parse_name(bad) is None
    assert lg.latest_names(["10.0.0.4.3.json", "10.0.0.4.12.json", "junk", "10.0.0.5.1.json"]) \
        == {"10.0.0.4": 12, "10.0.0.5": 1}


def test_the_transaction_replaces_the_table_whole():
    script = lg.nft_script("10.0.0.4", [Listening("10.0.0.5", 6, 1002),
                                        Listening("::1", 7, 1001)])
    name = "dl_listen_guard_10_0_0_4"
    assert script.startswith(f"table inet {name}\ndelete table inet {name}\n")
    assert f"add element inet {name} guarded4 {{ 10.0.0.5 . 6 }}" in script
    assert f"add element inet {name} owned4 {{ 10.0.0.5 . 6 . 1002 }}" in script
    assert f"add element inet {name} owned6 {{ ::1 . 7 . 1001 }}" in script
    assert "meta skuid != @owned4 reject with tcp reset" in script


def fake_proc(root: Path, sockets: list[tuple[str, int, int]], procs: list[tuple[int, int,
              list[int], str]]) -> Path:
    """A ``/proc`` with ``net/tcp`` (``(local hex, uid, inode)``) and processes ``(pid, uid,
    socket inodes, environ)``, each process directory owned by its uid as the kernel's."""
    (root / "net").mkdir(parents=True)
    (root / "net" / "tcp").write_text(HEADER + "".join(
        tcp_line(local, "0A", uid, inode) for local, uid, inode in sockets))
    for pid, uid, inodes, environ in procs:
        d = root / str(pid)
        (d / "fd").mkdir(parents=True)
        for n, inode in enumerate(inodes):
            os.symlink(f"socket:[{inode}]", d / "fd" / str(n))
        (d / "environ").write_bytes(environ.encode().replace(b"\n", b"\0"))
        os.chown(d, uid, uid)
    return root


@pytest.mark.skipif(os.geteuid() != 0, reason="a process directory owned by another uid")
def test_only_sockets_held_by_a_shares_process_and_owned_by_its_user_count(tmp_path):
    proc = fake_proc(tmp_path / "proc", [
        ("0500000A:1000", 1001, 1),  # the share's worker: guarded
        ("0500000A:2000", 1001, 2),  # the same user's TensorBoard, outside the share
        ("0500000A:3000", 0, 3),  # root's, in the share's process (the store root bound)
        ("00000000:4000", 1001, 4),  # the share's agent, on every address
    ], [
        (100, 1001, [1, 3], "PATH=/bin\nDL_SHARE_TOKEN=tok-a\n"),
        (101, 1001, [2], "PATH=/bin\n"),
        (102, 1001, [4], "DL_SHARE_TOKEN=tok-a\nX=1\n"),
    ])
    got = ls.job_listeners(proc, {"tok-a": 1001}, "10.0.0.5")
    assert got == {Listening("10.0.0.5", 0x1000, 1001), Listening("10.0.0.5", 0x4000, 1001),
                   Listening("127.0.0.1", 0x4000, 1001)}
    assert ls.job_listeners(proc, {"tok-b": 1001}, "10.0.0.5") == frozenset()


@pytest.mark.skipif(os.geteuid() != 0, reason="a process directory owned by another uid")
def test_a_slurm_tasks_sockets_are_for_its_jobs_user_and_slurms_daemons(tmp_path):
    proc = fake_proc(tmp_path / "proc", [
        ("0500000A:1000", 1001, 1),  # srun torchrun's store, in a task of 1001's job
        ("0500000A:2000", 1002, 2),  # 1002 names 1001 as its job's user: not believed
        ("0500000A:3000", 1001, 3),  # no Slurm job: 1001's own server
        ("0500000A:4000", 1001, 4),  # a job id but no user
    ], [
        (200, 1001, [1], "SLURM_JOB_ID=17\nSLURM_JOB_UID=1001\n"),
        (201, 1002, [2], "SLURM_JOB_ID=18\nSLURM_JOB_UID=1001\n"),
        (202, 1001, [3], "HOME=/home/a\n"),
        (203, 1001, [4], "SLURM_JOB_ID=19\n"),
    ])
    # the job's user, and Slurm's daemons (root: slurmstepd reports a task's exit to srun)
    assert ls.job_listeners(proc, {}, "10.0.0.5") == {Listening("10.0.0.5", 0x1000, 1001),
                                                      Listening("10.0.0.5", 0x1000, 0)}


def node(efs: Path, root: Path, address: str) -> ThisNode:
    this = ThisNode(NodePaths(root), ClusterPaths(efs), address)
    m = build_membership(cluster_id="c", generation=1, efs_mount=str(efs), reason="t",
                         master={"instance_id": "i-0", "address": "10.0.0.4", "gpus": 0},
                         workers=[{"instance_id": "i-1", "address": "10.0.0.5", "gpus": 0}])
    this.paths.membership.parent.mkdir(parents=True, exist_ok=True)
    this.paths.membership.write_text(m.to_json())
    return this


def table(address: str) -> str:
    res = subprocess.run(["nft", "list", "table", "inet", lg.table_name(address)],
                         capture_output=True, text=True, check=False)
    return res.stdout if res.returncode == 0 else ""


@pytest.mark.skipif(os.geteuid() != 0, reason="nftables and other users' processes")
def test_a_workers_listener_reaches_the_masters_table_and_goes_with_the_job(tmp_path):
    efs = tmp_path / "efs"
    (efs / "cluster").mkdir(parents=True)  # EFS is there (nothing is published before)
    proc = fake_proc(tmp_path / "proc", [("0500000A:1F40", 1001, 1)],
                     [(100, 1001, [1], "DL_SHARE_TOKEN=tok\n")])
    worker = lg.ListenGuard(node(efs, tmp_path / "w", "10.0.0.5"), proc=proc)
    master = lg.ListenGuard(node(efs, tmp_path / "m", "10.0.0.4"), proc=tmp_path / "none")
    try:
        worker.tick({"tok": 1001}, now=100.0)
        (published,) = os.listdir(efs / "cluster" / "listeners")
        rec = store.read_record(efs / "cluster" / "listeners" / published, NodeListeners)
        assert rec.listening == (Listening("10.0.0.5", 8000, 1001),)
        master.tick({}, now=100.0)
        assert "10.0.0.5 . 8000 . 1001" in table("10.0.0.4")
        # the job ends: the worker publishes nothing, the master's table lets it go
        worker.tick({}, now=101.0)
        master.tick({}, now=102.0)
        assert table("10.0.0.4") and "10.0.0.5 . 8000" not in table("10.0.0.4")
        assert len(os.listdir(efs / "cluster" / "listeners")) == 1  # the worker's, now empty
    finally:
        for guard in (worker, master):
            guard.release_all()
    assert not table("10.0.0.4") and not table("10.0.0.5")
    assert os.listdir(efs / "cluster" / "listeners") == []
