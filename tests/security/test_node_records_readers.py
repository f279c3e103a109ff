"""The master's other readers of node records (L34): ``dl-health``, ``dl-scale --status`` and
the job controller's wait for an attempt's shares to stop believe a node's registration and
heartbeat only with that node's signature, say so per node, and say plainly on a worker that
what they show is unchecked; a node that never sends its key (older user data) is named, with
what to do; a planted huge record is refused unread. Each check has its control: the same
forgery read where no key book is (the old, unchecked reading) is believed.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from bootstrap_scripts.jobs.controller import attempts, node_heartbeats
from bootstrap_scripts.jobs.engine.reachability import read_heartbeat
from bootstrap_scripts.node import node_keys
from bootstrap_scripts.ops import health, scale
from bootstrap_scripts.ops import node_records as nrec
from bootstrap_scripts.protocol import node_signature as nsig
from bootstrap_scripts.protocol import state, store
from bootstrap_scripts.protocol.membership import build_membership
from bootstrap_scripts.protocol.paths import ClusterPaths, NodePaths
from bootstrap_scripts.protocol.records import ExecutorHeartbeat, Registration, ShareStarted

MASTER = ("i-0aaaaaaaaaaaaaaa0", "10.0.0.4")
ATTACKER = ("i-0bbbbbbbbbbbbbbb1", "10.0.1.5")
VICTIM = ("i-0ccccccccccccccc2", "10.0.1.6")
OLD = ("i-0ddddddddddddddd3", "10.0.1.7")  # booted from user data older than node keys
MADE_UP = "i-0eeeeeeeeeeeeeee4"


@pytest.fixture()
def c(tmp_path: Path):
    """A master that learnt its own, A's and B's keys (not OLD's); a worker's root without
    a key book; the membership (master, A, B) on both; B registered and beating, signed."""
    efs = tmp_path / "efs"
    keys = {iid: nsig.new_private_key() for iid, _a in (MASTER, ATTACKER, VICTIM, OLD)}
    sign = {iid: nsig.signer(k, iid) for iid, k in keys.items()}
    master, worker = tmp_path / "master", tmp_path / "worker"
    book = node_keys.KeyBook(NodePaths(master))
    book.open()
    for iid in (MASTER[0], ATTACKER[0], VICTIM[0]):
        book.save(iid, nsig.public_pem(keys[iid]))
    m = build_membership(cluster_id="c", generation=1, efs_mount=str(efs),
                         master={"instance_id": MASTER[0], "address": MASTER[1], "gpus": 0},
                         workers=[{"instance_id": i, "address": a, "gpus": 0, "base": False}
                                  for i, a in (ATTACKER, VICTIM)])
    for root in (master, worker):
        NodePaths(root).membership.parent.mkdir(parents=True)
        NodePaths(root).membership.write_text(m.to_json())
    state.publish(efs, m, None)
    env = SimpleNamespace(efs=efs, master=master, worker=worker, sign=sign, m=m,
                          paths=ClusterPaths(efs))
    for node in (MASTER, ATTACKER, VICTIM):
        register(env, *node, by=node[0])
        beat(env, node[1], by=node[0])
    return env


def register(c, iid: str, address: str, *, by: str | None, gpus: int = 0) -> None:
    rec = Registration(instance_id=iid, address=address, role="worker", gpus=gpus,
                       cluster_id="c", generation_applied=1)
    state.write_registration(c.efs, rec, c.sign[by] if by else None)


def beat(c, address: str, *, by: str | None, seq: int = 1, state_: str = "running") -> None:
    hb = ExecutorHeartbeat(address=address, heartbeat=1.0e9, seq=seq, state=state_,
                           started_at=1.0e9, efs_ok=True, generation=1)
    store.atomic_write(c.paths.executor_heartbeat(address),
                       nsig.signed_record(hb.to_json(), c.sign[by] if by else None))


def run_health(root: Path, capsys) -> dict:
    assert health.main(["--root", str(root), "--json", "--heartbeat-timeout", "0.2"]) in (0, 1)
    return json.loads(capsys.readouterr().out)


def node_of(report: dict, address: str) -> dict:
    return next(n for n in report["nodes"] if n["address"] == address)


# -- dl-health -------------------------------------------------------------------------------


def test_dl_health_on_the_master_shows_whose_records_are_the_nodes_own(c, capsys):
    report = run_health(c.master, capsys)
    assert report["records"] == "checked"
    assert node_of(report, VICTIM[1])["signed"] == {"ok": True, "detail": "checked"}
    # root on A rewrites B's registration (more GPUs) and B's heartbeat (stopped), signed by A
    register(c, *VICTIM, by=ATTACKER[0], gpus=8)
    beat(c, VICTIM[1], by=ATTACKER[0], seq=2, state_="stopped")
    victim = node_of(run_health(c.master, capsys), VICTIM[1])
    assert not victim["signed"]["ok"]
    assert victim["signed"]["detail"].startswith("registration not signed by that node: ")
    assert "heartbeat not signed by that node: " in victim["signed"]["detail"]
    assert victim["agent"]["detail"] == "not registered"  # the forgery is not shown as B's
    assert victim["gpus"]["detail"] != "8 (expected 0)"
    assert victim["reachable"]["detail"] != "executor stopped"


def test_dl_health_on_a_worker_says_the_records_are_unchecked(c, capsys):
    register(c, *VICTIM, by=ATTACKER[0], gpus=8)
    report = run_health(c.worker, capsys)  # the control: the old reading believes it
    assert report["records"] == "unchecked"
    victim = node_of(report, VICTIM[1])
    assert victim["signed"] == {"ok": True, "detail": "unchecked here"}
    assert victim["gpus"]["detail"] == "8 (expected 0)"
    assert health.main(["--root", str(c.worker), "--heartbeat-timeout", "0.2"]) in (0, 1)
    assert nrec.UNCHECKED_HERE in capsys.readouterr().out


def replaying_between_reads(c, monkeypatch) -> None:
    """Root on A puts back B's own older signed beat (seq 10) after each read dl-health makes
    of B's heartbeat, and B's latest (seq 12) after the next: B is dead, its beats only
    replayed. Done between reads (dl-health's own reader wrapped), so it needs no timing."""
    beat(c, VICTIM[1], by=VICTIM[0], seq=12)
    turn = iter(range(10**6))

    class Replaying(nrec.NodeRecords):
        def heartbeat(self, address: str, instance_id: str):
            read = super().heartbeat(address, instance_id)
            if address == VICTIM[1]:
                beat(c, address, by=VICTIM[0], seq=10 if next(turn) % 2 == 0 else 12)
            return read

    monkeypatch.setattr(nrec, "NodeRecords", Replaying)


def test_dl_health_does_not_take_a_replayed_older_heartbeat_for_a_move(c, capsys,
                                                                       monkeypatch):
    replaying_between_reads(c, monkeypatch)
    victim = node_of(run_health(c.master, capsys), VICTIM[1])
    assert not victim["reachable"]["ok"], victim["reachable"]
    assert victim["signed"] == {"ok": True, "detail": "checked"}  # its own beats, only old


def test_without_a_key_book_the_replayed_heartbeat_moves(c, capsys, monkeypatch):
    replaying_between_reads(c, monkeypatch)  # the control: the unchecked reading
    assert node_of(run_health(c.worker, capsys), VICTIM[1])["reachable"]["ok"]


def test_dl_health_names_an_instance_waiting_for_its_node_key(c, capsys):
    register(c, *OLD, by=None)  # older user data: registers unsigned, never sends a key
    report = run_health(c.master, capsys)
    assert report["waiting_for_node_key"] == [OLD[0]]
    health.main(["--root", str(c.master), "--heartbeat-timeout", "0.2"])
    out = capsys.readouterr().out
    assert (f"registered but waiting for its node key (older user data? replace the "
            f"instance: an instance refresh): {OLD[0]}") in out


def test_the_master_logs_a_node_without_a_key_once_with_what_to_do(c, caplog):
    register(c, *OLD, by=None)
    check = node_keys.RecordCheck.for_node(NodePaths(c.master), logging.getLogger("t"))
    for _ in range(3):
        assert check.record(c.paths.registration(OLD[0]), Registration, instance_id=OLD[0],
                            what="node registration") is None
    lines = [r.getMessage() for r in caplog.records if "node-record-ignored" in r.getMessage()]
    assert len(lines) == 1
    assert f"no key learnt from {OLD[0]} yet" in lines[0]
    assert "older user data, replace it: an instance refresh" in lines[0]


# -- dl-scale --status -----------------------------------------------------------------------


def scale_status(c, root: Path) -> str:
    group = {"AutoScalingGroupName": "w", "DesiredCapacity": 3, "MinSize": 0, "MaxSize": 5,
             "Instances": [{"InstanceId": iid} for iid in (ATTACKER[0], VICTIM[0], OLD[0])]}
    return scale.status(scale.Cluster(c.m, c.efs, group, str(root)))


def test_dl_scale_lists_only_instances_their_own_registrations_name(c):
    register(c, MADE_UP, "10.0.1.99", by=ATTACKER[0])  # A invents a node
    register(c, *OLD, by=None)
    out = scale_status(c, c.master)
    assert MADE_UP not in out
    assert f"{OLD[0]:<20}    -  waiting for its node key" in out
    assert nrec.UNCHECKED_HERE not in out
    register(c, *VICTIM, by=ATTACKER[0])
    assert "member (registration not signed by that node" in scale_status(c, c.master)


def test_without_a_key_book_dl_scale_lists_the_invented_node_and_says_unchecked(c):
    register(c, MADE_UP, "10.0.1.99", by=ATTACKER[0])
    out = scale_status(c, c.worker)
    assert MADE_UP in out and out.endswith(nrec.UNCHECKED_HERE)


# -- the controller's wait for an attempt's shares -------------------------------------------


def started_on_victim(c) -> Path:
    jpaths = ClusterPaths(c.efs).job("job-1", "alice")
    jpaths.nodes.mkdir(parents=True)
    store.write_record(jpaths.started(0), ShareStarted(rank=0, address=VICTIM[1],
                                                       started_at=1.0e9))
    return jpaths


def test_a_forged_stopped_heartbeat_does_not_end_the_wait_for_running_shares(c):
    jpaths = started_on_victim(c)
    node_heartbeats.reader(c.master)(c.efs, VICTIM[1])  # the controller saw B's own beat
    beat(c, VICTIM[1], by=ATTACKER[0], seq=2, state_="stopped")
    assert not attempts.wait_stopped(jpaths, c.efs, timeout=0.3, root=c.master)


def test_without_the_check_the_forged_stopped_heartbeat_ends_the_wait(c):
    jpaths = started_on_victim(c)
    beat(c, VICTIM[1], by=ATTACKER[0], seq=2, state_="stopped")
    assert attempts.wait_stopped(jpaths, c.efs, timeout=0.3)


# -- a planted huge record -------------------------------------------------------------------


def test_a_record_larger_than_a_node_writes_is_refused_by_name(c, caplog):
    limit = store.NODE_RECORD_LIMIT
    path = c.paths.registration(VICTIM[0])
    with open(path, "w") as fh:
        fh.write('{"pad": "' + "x" * limit + '"}')
    with pytest.raises(store.RecordTooLarge, match=f"larger than {limit} bytes"):
        store.read_text(path, limit=limit)
    assert len(store.read_text(path) or "") > limit  # unbounded readers are unchanged
    check = node_keys.RecordCheck.for_node(NodePaths(c.master), logging.getLogger("t"))
    assert check.record(path, Registration, instance_id=VICTIM[0],
                        what="node registration") is None
    assert f"larger than {limit} bytes" in caplog.text
    assert state.read_registration(c.efs, VICTIM[0]) is None
    hb = c.paths.executor_heartbeat(VICTIM[1])
    hb.write_text(" " * (limit + 1))
    assert read_heartbeat(c.efs, VICTIM[1]) is None
    text = ExecutorHeartbeat(address=VICTIM[1], heartbeat=1.0).to_json()
    hb.write_text(" " * (limit - len(text)) + text)
    assert read_heartbeat(c.efs, VICTIM[1]) is not None  # at the bound: still read
