"""Drill: a worker cannot speak for another node. Root on worker A can write any file on
EFS, so it can write worker B's registration, B's job executor heartbeat and B's drain
acknowledgement, the three records the master acts on. Each node signs its records with a
key of its own (its agent makes it on the node's disk), and the master learns each public
key from the instance itself through SQS (moto's real server over HTTP: the ``SenderId`` of
a message is the signing session's ``<role id>:<instance id>``, as AWS sets it), then
believes a record only with the signature of the node it names.

The nodes' side is the product's own code (``NodeKey`` announcing, ``state.write_registration``
signing, the executor's ``Drain`` writing its ``.done``, ``NodeSigner`` as the executor's
heartbeat uses it); the master's is ``KeyServer``, ``Roster``, ``Drains`` and the job
controller's ``SignedHeartbeats`` with ``node_evidence.executor_gone``. Each forgery comes in
three forms: unsigned, B's real signed record with its content changed, and A's own
signature on a record naming B. The control tests run the same forgeries against a master
that checks nothing, so the drill can fail.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import threading
from pathlib import Path
from types import SimpleNamespace

import boto3
import pytest

from bootstrap_scripts.agent.drains import Drains
from bootstrap_scripts.agent.node_keys_queue import KeyServer, NodeKey
from bootstrap_scripts.agent.roster import Roster
from bootstrap_scripts.jobs.controller import node_evidence
from bootstrap_scripts.jobs.controller.node_heartbeats import SignedHeartbeats
from bootstrap_scripts.jobs.engine.reachability import read_heartbeat
from bootstrap_scripts.jobs.executor.drain import Drain
from bootstrap_scripts.node import node_keys
from bootstrap_scripts.protocol import state, store
from bootstrap_scripts.protocol.membership import build_membership
from bootstrap_scripts.protocol.paths import ClusterPaths, NodePaths
from bootstrap_scripts.protocol.records import DrainRecord, ExecutorHeartbeat, Registration
from tests.conftest import REGION

MASTER = ("i-0aaaaaaaaaaaaaaa0", "10.0.0.4")
ATTACKER = ("i-0bbbbbbbbbbbbbbb1", "10.0.1.5")
VICTIM = ("i-0ccccccccccccccc2", "10.0.1.6")
TRUST = {"Version": "2012-10-17", "Statement": [{
    "Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"},
    "Action": "sts:AssumeRole"}]}
LOG = logging.getLogger("drill-master")


def instance_sqs(role_arn: str, instance_id: str):
    """An SQS client signing as ``instance_id``'s instance profile session (EC2 names the
    session after the instance)."""
    creds = boto3.client("sts").assume_role(RoleArn=role_arn,
                                            RoleSessionName=instance_id)["Credentials"]
    return boto3.client("sqs", aws_access_key_id=creds["AccessKeyId"],
                        aws_secret_access_key=creds["SecretAccessKey"],
                        aws_session_token=creds["SessionToken"])


def learn_all(server: KeyServer) -> None:
    while server.serve_once(wait=0):
        pass


@pytest.fixture()
def cluster(tmp_path: Path, moto_reset: str, monkeypatch):
    """A master that learnt A's and B's keys over SQS; B registered and beat once."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_reset)
    role = boto3.client("iam").create_role(RoleName="WorkerRole",
                                           AssumeRolePolicyDocument=json.dumps(TRUST))["Role"]
    queue = boto3.client("sqs").create_queue(QueueName="node-keys")["QueueUrl"]
    efs = tmp_path / "efs"
    for d in (ClusterPaths(efs).nodes_dir, ClusterPaths(efs).executors_dir,
              ClusterPaths(efs).drain_dir):
        d.mkdir(parents=True)
    master = NodePaths(tmp_path / "master")
    book = node_keys.KeyBook(master)
    book.open()
    server = KeyServer(queue_url=queue, worker_role_id=role["RoleId"],
                       sqs=lambda: boto3.client("sqs"), book=book, log=LOG,
                       stop=threading.Event())
    nodes = {}
    for name, (iid, address) in (("attacker", ATTACKER), ("victim", VICTIM)):
        paths = NodePaths(tmp_path / name)
        key = NodeKey(paths, instance_id=iid, queue_url=queue, region=REGION,
                      client=instance_sqs(role["Arn"], iid), log=LOG)
        assert key.announce(MASTER[0])
        nodes[name] = SimpleNamespace(paths=paths, key=key, iid=iid, address=address)
    learn_all(server)
    assert book.key_of(VICTIM[0]) is not None and book.key_of(ATTACKER[0]) is not None
    m = build_membership(cluster_id="c", generation=1,
                         master={"instance_id": MASTER[0], "address": MASTER[1], "gpus": 0},
                         workers=[{"instance_id": iid, "address": a, "gpus": 0}
                                  for iid, a in (ATTACKER, VICTIM)])
    master.membership.parent.mkdir(parents=True)
    master.membership.write_text(m.to_json())
    return SimpleNamespace(efs=efs, paths=ClusterPaths(efs), master=master, book=book,
                           server=server, queue=queue, role=role, **nodes)


def registration(iid: str, address: str, gpus: int = 8) -> Registration:
    return Registration(instance_id=iid, address=address, role="worker", gpus=gpus,
                        cluster_id="c", heartbeat=1.0e9, started_at=1.0e9)


def forgeries(path: Path, real_text: str, attacker: NodeKey, change: dict) -> list[str]:
    """Three forms of the same forgery of the record at ``path``: unsigned with ``change``,
    the victim's real signed text with ``change``, ``change`` signed by the attacker."""
    doc = json.loads(real_text)
    unsigned = {k: v for k, v in {**doc, **change}.items() if k != "signature"}
    tampered = {**doc, **change}
    by_attacker = node_keys.nsig.signed_record(json.dumps(unsigned), attacker.sign)
    return [json.dumps(unsigned), json.dumps(tampered), by_attacker]


def master_roster(c, *, checked: bool = True) -> Roster:
    agent = SimpleNamespace(config=SimpleNamespace(membership_key="", cluster_id="c",
                                                   region=REGION),
                            cluster=c.paths, log=LOG,
                            paths=c.master if checked else NodePaths(c.master.root / "none"))
    roster = Roster(agent, aws=None)  # type: ignore[arg-type]
    roster.group_members = {ATTACKER[0]}  # B is in no group: only a registration adds it
    return roster


# -- registrations ---------------------------------------------------------------------------


def test_a_registration_a_worker_forges_adds_no_node(cluster, caplog):
    c = cluster
    path = c.paths.registration(VICTIM[0])
    state.write_registration(c.efs, registration(*VICTIM), c.victim.key.sign)
    real = path.read_text()
    roster = master_roster(c)
    assert roster.registered_outsiders() == (VICTIM[0],)  # B's own registration counts
    assert roster.read_registrations([VICTIM[0]])[VICTIM[0]].gpus == 8
    path.unlink()
    for forged in forgeries(path, real, c.attacker.key, {"gpus": 1, "heartbeat": 2.0e9}):
        store.atomic_write(path, forged)
        with caplog.at_level(logging.WARNING, logger="drill-master"):
            assert roster.registered_outsiders() == ()
            assert roster.read_registrations([VICTIM[0]]) == {}
    ignored = [r.getMessage() for r in caplog.records if "node-record-ignored" in r.getMessage()]
    assert any(str(path) in line and "not signed" in line for line in ignored)
    assert any(str(path) in line and f"not {VICTIM[0]}'s own" in line for line in ignored)


def test_a_node_whose_key_is_not_learnt_is_not_registered_yet(cluster):
    c = cluster
    late = NodePaths(c.master.root.parent / "late")
    key = NodeKey(late, instance_id="i-0ddddddddddddddd3", log=LOG)
    state.write_registration(c.efs, registration("i-0ddddddddddddddd3", "10.0.1.7"), key.sign)
    assert master_roster(c).registered_outsiders() == ()
    key.queue_url, key.client = c.queue, instance_sqs(c.role["Arn"], "i-0ddddddddddddddd3")
    assert key.announce(MASTER[0])
    learn_all(c.server)
    assert master_roster(c).registered_outsiders() == ("i-0ddddddddddddddd3",)


def test_a_key_sent_for_another_instance_is_not_learnt(cluster, caplog):
    """A sends a message whose body names B with A's key: SQS says A sent it."""
    c = cluster
    before = (c.master.node_keys_dir / f"{VICTIM[0]}.pem").read_bytes()
    forged = json.dumps({"instance": VICTIM[0], "public_key": c.attacker.key.public.decode()})
    instance_sqs(c.role["Arn"], ATTACKER[0]).send_message(QueueUrl=c.queue, MessageBody=forged)
    with caplog.at_level(logging.WARNING, logger="drill-master"):
        learn_all(c.server)
    assert (c.master.node_keys_dir / f"{VICTIM[0]}.pem").read_bytes() == before
    assert any("node-key-refused" in r.getMessage() and "speaks for itself only"
               in r.getMessage() for r in caplog.records)


def test_without_the_check_the_forged_registration_adds_the_node(cluster):
    c = cluster
    path = c.paths.registration(VICTIM[0])
    state.write_registration(c.efs, registration(*VICTIM), c.victim.key.sign)
    real = path.read_text()
    roster = master_roster(c, checked=False)
    for forged in forgeries(path, real, c.attacker.key, {"gpus": 1}):
        store.atomic_write(path, forged)
        assert roster.registered_outsiders() == (VICTIM[0],)
        assert roster.read_registrations([VICTIM[0]])[VICTIM[0]].gpus == 1


# -- executor heartbeats ---------------------------------------------------------------------


def beat(signer: node_keys.NodeSigner, path: Path, seq: int) -> str:
    """The executor's heartbeat write (``daemon.Executor._beat``'s)."""
    text = signer.signed(ExecutorHeartbeat(address=VICTIM[1], heartbeat=1.0e9 + seq, seq=seq,
                                           started_at=1.0e9).to_json())
    store.atomic_write(path, text)
    return text


def forged_beats(c, real: list[str]):
    """Makers of each forged heartbeat form, by sequence number: unsigned, B's signed beat
    with its seq changed, A's signature, and B's own older beats replayed in turn."""
    def unsigned(n):
        doc = {k: v for k, v in json.loads(real[-1]).items() if k != "signature"}
        return json.dumps({**doc, "seq": n})

    def tampered(n):
        return json.dumps({**json.loads(real[-1]), "seq": n})

    def by_attacker(n):
        return node_keys.nsig.signed_record(unsigned(n), c.attacker.key.sign)

    def replayed(n):
        return real[n % (len(real) - 1)]  # never the latest

    return [unsigned, tampered, by_attacker, replayed]


def dead_victim_judged(c, read) -> bool:
    """B's executor beat a few times and died; A forges on. Is B's executor gone?"""
    path = c.paths.executor_heartbeat(VICTIM[1])
    signer = node_keys.NodeSigner(c.victim.paths)
    real = []
    for seq in range(1, 5):
        real.append(beat(signer, path, seq))
        read(c.efs, VICTIM[1])  # the controller watched it beat
    forms, turn = forged_beats(c, real), itertools.count(100)

    def forged_then_read(efs: Path, address: str):
        """Root on A writes the next forged form before each look (every form is seen in
        turn: a thread forging on its own clock was sampled by chance, and could miss one)."""
        n = next(turn)
        store.atomic_write(path, forms[n % len(forms)](n))
        return read(efs, address)

    return node_evidence.executor_gone(c.efs, VICTIM[1], tick=lambda: None,
                                       silent_after=2.0, read=forged_then_read)


def test_a_forged_heartbeat_does_not_keep_a_dead_node_alive(cluster, caplog):
    with caplog.at_level(logging.WARNING, logger="dl-controller"):
        assert dead_victim_judged(cluster, SignedHeartbeats(cluster.master.root)) is True
    lines = " ".join(r.getMessage() for r in caplog.records)
    assert "node-record-ignored" in lines and "a replay" in lines


def test_a_live_nodes_signed_heartbeat_is_believed(cluster):
    c = cluster
    read = SignedHeartbeats(c.master.root)
    path = c.paths.executor_heartbeat(VICTIM[1])
    signer = node_keys.NodeSigner(c.victim.paths)
    stop = threading.Event()

    def live():
        seq = 0
        while not stop.wait(0.1):
            seq += 1
            beat(signer, path, seq)

    thread = threading.Thread(target=live)
    thread.start()
    try:
        assert node_evidence.executor_gone(c.efs, VICTIM[1], tick=lambda: None,
                                           silent_after=2.0, read=read) is False
    finally:
        stop.set()
        thread.join()


def test_without_the_check_the_forged_heartbeat_keeps_the_dead_node_alive(cluster):
    assert dead_victim_judged(cluster, read_heartbeat) is False


# -- drain acknowledgements ------------------------------------------------------------------


class FakeAws:
    def __init__(self) -> None:
        self.completed: list[str] = []

    def complete_lifecycle_action(self, record):
        self.completed.append(record.instance_id)
        return SimpleNamespace(final=True, outcome="completed", error=None)


def drain_of_victim(c, records) -> tuple[Drains, FakeAws, DrainRecord]:
    aws = FakeAws()
    drains = Drains(c.paths, aws, drain_timeout=300, log=LOG,  # type: ignore[arg-type]
                    records=records)
    record = DrainRecord(instance_id=VICTIM[0], address=VICTIM[1], requested_at=2.0e9,
                         deadline=4.0e9, asg="workers", role="worker", lifecycle_hook="drain",
                         lifecycle_action_token="t-1", member=True)
    drains.active[VICTIM[0]] = record
    return drains, aws, record


def victim_executor_done(c, record: DrainRecord) -> str:
    """B's job executor's own ``.done`` (``executor.drain.Drain``), for ``record``."""
    c.victim.paths.applied_drain.parent.mkdir(parents=True, exist_ok=True)
    store.write_record(c.victim.paths.applied_drain, record)
    node = SimpleNamespace(paths=c.victim.paths, address=VICTIM[1], cluster=c.paths)
    Drain(node, SimpleNamespace(running={})).check()  # type: ignore[arg-type]
    return c.paths.drain_done(VICTIM[0]).read_text()


def drain_forgeries(c, record: DrainRecord) -> list[str]:
    """B's real ``.done`` of an older drain, that one changed to this drain, unsigned and A's."""
    old = victim_executor_done(c, dataclasses.replace(record, requested_at=1.0e9))
    forms = forgeries(c.paths.drain_done(VICTIM[0]), old, c.attacker.key,
                      {"requested_at": record.requested_at})
    c.paths.drain_done(VICTIM[0]).unlink()
    return [old, *forms]


def test_a_forged_drain_done_ends_no_drain(cluster, caplog):
    c = cluster
    drains, aws, record = drain_of_victim(c, node_keys.RecordCheck.for_node(c.master, LOG))
    path = c.paths.drain_done(VICTIM[0])
    with caplog.at_level(logging.WARNING, logger="drill-master"):
        for forged in drain_forgeries(c, record):
            store.atomic_write(path, forged)
            drains.check()
            assert aws.completed == [] and VICTIM[0] in drains.active
    assert any("node-record-ignored" in r.getMessage() and str(path) in r.getMessage()
               for r in caplog.records)
    victim_executor_done(c, record)  # B's executor really is done: the drain ends
    drains.check()
    assert aws.completed == [VICTIM[0]] and VICTIM[0] not in drains.active


def test_without_the_check_a_forged_drain_done_ends_the_drain(cluster):
    c = cluster
    for forged in drain_forgeries(c, drain_of_victim(c, None)[2]):
        drains, aws, _record = drain_of_victim(c, None)
        store.atomic_write(c.paths.drain_done(VICTIM[0]), forged)
        drains.check()
        assert aws.completed == [VICTIM[0]]


# -- a new master's window -------------------------------------------------------------------

NEW_MASTER = "i-0fffffffffffffff5"


def test_a_new_master_reads_heartbeats_unchecked_until_it_relearns_the_key(cluster, caplog):
    """A master recovered on a new instance starts with an empty key book. Until B's key
    reaches it (B sends it again on seeing the new master), B's heartbeats are read
    unchecked and logged so (L34: a heartbeat read as missing would mark a healthy node):
    a forgery written in that window is read. Once the key is learnt again, the same
    forgery is ignored and B's own beat believed."""
    c = cluster
    new = NodePaths(c.master.root.parent / "new-master")
    book = node_keys.KeyBook(new)
    book.open()
    new.membership.parent.mkdir(parents=True)
    new.membership.write_text(c.master.membership.read_text())
    server = KeyServer(queue_url=c.queue, worker_role_id=c.role["RoleId"],
                       sqs=lambda: boto3.client("sqs"), book=book, log=LOG,
                       stop=threading.Event())
    learn_all(server)  # what the old master left on the queue is gone: nothing to learn
    assert book.key_of(VICTIM[0]) is None
    read = SignedHeartbeats(new.root)
    path = c.paths.executor_heartbeat(VICTIM[1])
    own = beat(node_keys.NodeSigner(c.victim.paths), path, 1)
    unsigned = {k: v for k, v in json.loads(own).items() if k != "signature"}
    forged = node_keys.nsig.signed_record(json.dumps({**unsigned, "seq": 7, "state": "stopped"}),
                                          c.attacker.key.sign)
    store.atomic_write(path, forged)
    with caplog.at_level(logging.WARNING, logger="dl-controller"):
        window = read(c.efs, VICTIM[1])
    assert window is not None and (window.seq, window.state) == (7, "stopped")
    assert any("node-record-ignored" in r.getMessage() and str(path) in r.getMessage()
               and "read unchecked" in r.getMessage() for r in caplog.records)

    assert c.victim.key.announce(NEW_MASTER)  # B sees the new master: it sends its key again
    learn_all(server)
    assert book.key_of(VICTIM[0]) is not None
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="dl-controller"):
        assert read(c.efs, VICTIM[1]) is None  # the forgery is no beat any more
    assert any(str(path) in r.getMessage() and f"not {VICTIM[0]}'s own" in r.getMessage()
               for r in caplog.records)
    beat(node_keys.NodeSigner(c.victim.paths), path, 2)
    assert read(c.efs, VICTIM[1]).seq == 2  # B's own beat is believed
    store.atomic_write(path, forged)
    assert read(c.efs, VICTIM[1]).seq == 2  # ignored again: B's own beat stays the latest
