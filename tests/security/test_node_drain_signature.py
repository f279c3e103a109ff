"""Drill: no worker can drain another. A drain request stops every job share on the node
it names, so root on one worker (which can write anything on EFS) could stop the jobs on
every other worker by writing ``cluster/drain/<their id>.json``. The master signs each
drain request with the cluster's membership key (moto's real KMS server: ``kms:Sign`` on
the master; every node checks with the key's public half from ``kms:GetPublicKey``,
locally); a worker's agent takes only its own, signed
request and hands its job executor a copy on the node's own disk, and the executor drains
on that copy only.

The worker side is the agent's own code (``worker.accept_drain``) and the executor's
(``executor.drain.Drain.find_request``); the master side is ``agent.drains.Drains``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import boto3
import pytest

from bootstrap_scripts.agent.drains import Drains
from bootstrap_scripts.agent.membership_key import MembershipKey, MembershipKeyError
from bootstrap_scripts.agent.worker import accept_drain
from bootstrap_scripts.jobs.executor.drain import Drain
from bootstrap_scripts.protocol import membership_signature as sig
from bootstrap_scripts.protocol import state
from bootstrap_scripts.protocol.membership import Node
from bootstrap_scripts.protocol.messages import DrainRequest
from bootstrap_scripts.protocol.paths import ClusterPaths, NodePaths
from bootstrap_scripts.protocol.records import DrainRecord
from tests.conftest import REGION

VICTIM = ("i-0victim0000000001", "10.0.1.5")
OTHER = ("i-0other00000000002", "10.0.1.6")


def drain_record(instance_id: str, address: str) -> DrainRecord:
    return DrainRecord(instance_id=instance_id, address=address, requested_at=1.0e9,
                       deadline=1.0e9 + 300, asg="workers", role="worker",
                       lifecycle_hook="drain", lifecycle_action_token="t-1", member=True)


def new_key(endpoint: str) -> str:
    kms = boto3.client("kms", endpoint_url=endpoint, region_name=REGION)
    return kms.create_key(KeySpec="ECC_NIST_P256", KeyUsage="SIGN_VERIFY")["KeyMetadata"][
        "Arn"]


def worker_agent(efs: Path, root: Path, instance_id: str) -> SimpleNamespace:
    """A worker's agent as ``accept_drain`` sees it."""
    return SimpleNamespace(cluster=ClusterPaths(efs), paths=NodePaths(root),
                           identity=SimpleNamespace(instance_id=instance_id),
                           log=logging.getLogger("drill-worker"))


def executor_sees(root: Path, address: str) -> DrainRecord | None:
    """What the victim's job executor finds (it drains when this is not None)."""
    found = Drain(SimpleNamespace(paths=NodePaths(root), address=address),
                  shares=None).find_request()  # type: ignore[arg-type]
    return None if found is None else found[1]


@pytest.fixture()
def cluster(tmp_path: Path, moto_reset: str, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_reset)
    efs = tmp_path / "efs"
    ClusterPaths(efs).drain_dir.mkdir(parents=True)
    root = tmp_path / "victim"
    NodePaths(root).agent_state.parent.mkdir(parents=True)
    key = new_key(moto_reset)
    return SimpleNamespace(efs=efs, paths=ClusterPaths(efs), root=root, endpoint=moto_reset,
                           master=MembershipKey(key, REGION),
                           verify=MembershipKey(key, REGION).verify,
                           victim=worker_agent(efs, root, VICTIM[0]))


def test_a_drain_request_a_worker_wrote_drains_nobody(cluster):
    c = cluster
    path = c.paths.drain_request(VICTIM[0])
    # root on another worker writes a drain request naming the victim: unsigned ...
    state.write_drain(c.efs, drain_record(*VICTIM))
    assert accept_drain(c.victim, c.verify) is False
    assert executor_sees(c.root, VICTIM[1]) is None
    # ... with the signature of the master's request for another node copied onto it ...
    state.write_drain(c.efs, drain_record(*OTHER), c.master.sign)
    theirs = json.loads(c.paths.drain_request(OTHER[0]).read_text())[sig.FIELD]
    path.write_text(json.dumps(json.loads(drain_record(*VICTIM).to_json()) | {sig.FIELD: theirs}))
    assert accept_drain(c.victim, c.verify) is False
    # ... or signed with a key of its own, named in the document ...
    own = MembershipKey(new_key(c.endpoint), REGION)
    state.write_drain(c.efs, drain_record(*VICTIM), own.sign)
    assert accept_drain(c.victim, c.verify) is False
    # ... or the master's own signed request for another node, renamed to the victim's
    c.paths.drain_request(OTHER[0]).rename(path)
    assert accept_drain(c.victim, c.verify) is False
    assert executor_sees(c.root, VICTIM[1]) is None
    assert not NodePaths(c.root).applied_drain.exists()

    # the master's request for the victim drains it
    state.write_drain(c.efs, drain_record(*VICTIM), c.master.sign)
    assert accept_drain(c.victim, c.verify) is True
    found = executor_sees(c.root, VICTIM[1])
    assert found is not None and found.instance_id == VICTIM[0]


def test_without_the_check_the_forgery_would_drain(cluster):
    """The drill can fail: a worker agent that checks no signature (no key) takes the
    forged request, and the victim's executor drains."""
    c = cluster
    state.write_drain(c.efs, drain_record(*VICTIM))
    assert accept_drain(c.victim, None) is True
    assert executor_sees(c.root, VICTIM[1]) is not None


def test_kms_unreachable_is_retried_not_concluded(cluster, monkeypatch):
    c = cluster
    state.write_drain(c.efs, drain_record(*VICTIM), c.master.sign)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens
    assert accept_drain(c.victim, MembershipKey(c.master.key_id, REGION).verify) is None
    assert executor_sees(c.root, VICTIM[1]) is None


class FakeAws:
    def complete_lifecycle_action(self, record):  # pragma: no cover - not reached here
        raise AssertionError("the drain is not due")


def test_the_master_signs_its_drain_requests_and_signs_later_when_kms_fails(tmp_path: Path):
    efs = tmp_path / "efs"
    ClusterPaths(efs).drain_dir.mkdir(parents=True)
    calls: list[bytes] = []
    failing = [True]

    def sign(digest: bytes) -> sig.Signature:
        calls.append(digest)
        if failing[0]:
            raise MembershipKeyError("kms:Sign failed: no network")
        return sig.Signature("k", sig.ALGORITHM, b"S" + digest)

    def verify(digest: bytes, s: sig.Signature) -> bool:
        return s.value == b"S" + digest

    drains = Drains(ClusterPaths(efs), FakeAws(), drain_timeout=300,  # type: ignore[arg-type]
                    log=logging.getLogger("drill-master"), sign=sign)
    msg = DrainRequest(cluster_id="c", instance_id=VICTIM[0], asg="workers", role="worker",
                       lifecycle_hook="drain", lifecycle_action_token="t-1")
    member = Node(rank=1, role="worker", instance_id=VICTIM[0], address=VICTIM[1],
                  alias="deeplearning-worker1")
    drains.start(msg, member=member, address=VICTIM[1], is_master=False, formed=True)
    text = ClusterPaths(efs).drain_request(VICTIM[0]).read_text()
    assert "not signed" in sig.check(text, verify, "drain request")  # KMS failed: unsigned
    assert VICTIM[0] in drains.unsigned
    failing[0] = False
    drains.check()  # the next check signs it
    text = ClusterPaths(efs).drain_request(VICTIM[0]).read_text()
    assert sig.check(text, verify, "drain request") == "" and not drains.unsigned
    assert state.read_drain(efs, VICTIM[0]).address == VICTIM[1]  # the master still reads it


def test_a_new_master_resumes_only_the_drains_the_master_signed(cluster):
    """A pending drain record a worker plants on EFS would make a new master (one that
    took over) treat the victim as draining: held out of the membership until the record's
    deadline, then its registration forgotten. The new master resumes only the records
    the master signed."""
    c = cluster
    state.write_drain(c.efs, drain_record(*VICTIM))  # root on a worker: unsigned
    own = MembershipKey(new_key(c.endpoint), REGION)
    state.write_drain(c.efs, drain_record(*OTHER), own.sign)  # signed with its own key
    master = Drains(c.paths, FakeAws(), drain_timeout=300,  # type: ignore[arg-type]
                    log=logging.getLogger("drill-master"), sign=c.master.sign,
                    verify=c.verify)
    master.resume()
    assert VICTIM[0] not in master and OTHER[0] not in master
    # the master's own pending record is resumed
    state.write_drain(c.efs, drain_record(*VICTIM), c.master.sign)
    master.resume()
    assert VICTIM[0] in master and OTHER[0] not in master


def test_without_the_check_a_new_master_would_resume_the_forgery(cluster):
    """The drill can fail: a master that verifies nothing resumes the planted record."""
    c = cluster
    state.write_drain(c.efs, drain_record(*VICTIM))
    master = Drains(c.paths, FakeAws(), drain_timeout=300,  # type: ignore[arg-type]
                    log=logging.getLogger("drill-master"))
    master.resume()
    assert VICTIM[0] in master
