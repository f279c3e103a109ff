"""The protocol's records, store and paths: strict in, sorted out, errors that name the file."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.errors import ProtocolError
from bootstrap_scripts.protocol.jobs import JobSpec, JobSpecError, Proc, Share, join_share
from bootstrap_scripts.protocol.membership import MembershipError, build_membership
from bootstrap_scripts.protocol.paths import ClusterPaths, NodePaths, validate_job_id
from bootstrap_scripts.protocol.records import (
    DrainRecord,
    ExecutorHeartbeat,
    JobResult,
    NodeResult,
    Registration,
    ShareClaim,
    ShareExit,
)


def test_round_trip_keeps_every_field() -> None:
    hb = ExecutorHeartbeat(address="127.20.0.4", heartbeat=12.5, seq=3, running=("job-a",),
                           efs_mounted=True, gpus=8)
    assert ExecutorHeartbeat.from_json(hb.to_json()) == hb
    result = JobResult(job_id="j-1", status="failed", launcher="torchrun",
                       nodes=(NodeResult(rank=1, address="127.20.128.3", returncode=-9,
                                         reason="killed"),))
    assert JobResult.from_json(result.to_json()) == result
    assert json.loads(result.to_json())["nodes"][0]["returncode"] == -9


def test_a_bad_field_is_named_with_its_file(tmp_path) -> None:
    path = tmp_path / "0.exit"
    path.write_text(json.dumps({"rank": "zero", "address": "a", "returncode": 1}))
    with pytest.raises(ProtocolError) as err:
        store.read_record(path, ShareExit)
    assert err.value.source == str(path) and err.value.field == "rank"
    assert "expected int, got 'zero'" in str(err.value)


def test_missing_required_field_and_non_object_and_bad_json(tmp_path) -> None:
    with pytest.raises(ProtocolError, match="field 'address': missing"):
        Registration.from_dict({"instance_id": "i-1", "role": "worker"})
    with pytest.raises(ProtocolError, match="must be a JSON object"):
        ShareClaim.from_json("[1, 2]")
    with pytest.raises(ProtocolError, match="not valid JSON"):
        ShareClaim.from_json("{", source="x.claim")
    with pytest.raises(ProtocolError, match=r"field 'running\[1\]'"):
        ExecutorHeartbeat.from_dict({"address": "a", "heartbeat": 1, "running": ["a", 2]})


def test_booleans_are_not_integers_and_unknown_fields_are_ignored() -> None:
    with pytest.raises(ProtocolError, match="field 'rank'"):
        ShareExit.from_dict({"rank": True, "address": "a", "returncode": 0})
    rec = ShareExit.from_dict({"rank": 0, "address": "a", "returncode": 0, "future": 1})
    assert rec.returncode == 0


def test_drain_record_completion_is_derived() -> None:
    rec = DrainRecord(instance_id="i-1", address="a", requested_at=1.0, deadline=2.0, asg="g",
                      role="worker", lifecycle_hook="drain", lifecycle_action_token="t")
    assert not rec.completed
    done = dataclasses.replace(rec, completed_at=3.0, reason="done")
    assert DrainRecord.from_json(done.to_json()).completed


def test_store_writes_atomically_and_idempotently(tmp_path) -> None:
    path = tmp_path / "a" / "b.json"
    assert store.atomic_write(path, "one\n")
    mtime = path.stat().st_mtime_ns
    assert not store.atomic_write(path, "one\n")  # same content: nothing written
    assert path.stat().st_mtime_ns == mtime
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    assert [p.name for p in path.parent.iterdir()] == ["b.json"]  # no temp file left
    assert store.read_record(tmp_path / "missing.json", ShareExit) is None


def test_scan_skips_malformed_and_temp_files(tmp_path) -> None:
    good = Registration(instance_id="i-1", address="127.20.0.4", role="master")
    store.write_record(tmp_path / "i-1.json", good)
    (tmp_path / "i-2.json").write_text("{broken")
    (tmp_path / ".i-3.json.tmp").write_text(good.to_json())
    assert list(store.scan_records(tmp_path, Registration)) == [("i-1", good)]


def test_create_exclusive_claims_once(tmp_path) -> None:
    path = tmp_path / "nodes" / "3.claim"
    assert store.create_exclusive(path, "{}")
    assert not store.create_exclusive(path, "{}")


def test_paths_are_under_their_roots(tmp_path) -> None:
    cluster = ClusterPaths(tmp_path)
    job = cluster.job("train-1", "alice")
    assert job.exit(2) == tmp_path / "jobs" / "alice" / "train-1" / "nodes" / "2.exit"
    assert job.log(0, "ps") == tmp_path / "jobs" / "alice" / "train-1" / "nodes" / "0-ps.log"
    assert job.key == "alice/train-1" and cluster.job("alice/train-1") == job
    assert cluster.managed("bob/t").attempt_key(2) == "bob/t.2"
    assert cluster.drain_done("i-9") == tmp_path / "cluster" / "drain" / "i-9.done"
    assert NodePaths(tmp_path).env == tmp_path / "opt" / "deeplearning" / "env"
    with pytest.raises(ValueError, match="'maybe'"):
        cluster.prepared("i-1", "maybe")


@pytest.mark.parametrize("bad", ["", "../x", ".hidden", "a/b", "x" * 129])
def test_job_ids_that_would_escape_are_refused(bad: str) -> None:
    with pytest.raises(ProtocolError, match="invalid job id"):
        validate_job_id(bad)
    with pytest.raises(ProtocolError):
        ClusterPaths("/efs").job(bad, "alice")


@pytest.mark.parametrize("bad", ["../x", "alice/../x", "../alice/x", "Alice/x", "a.b/x",
                                 "alice/x/y", "/x", "alice/", "alice/.x"])
def test_job_keys_name_a_user_and_an_id_never_a_path(bad: str) -> None:
    """A key ``<user>/<job-id>``: the user validated like a user's directory name, the id
    like a job id; nothing else passes."""
    with pytest.raises(ProtocolError):
        ClusterPaths("/efs").job(bad)
    with pytest.raises(ProtocolError):
        ClusterPaths("/efs").managed(bad)


def test_job_spec_round_trip_and_errors() -> None:
    spec = JobSpec(job_id="j-1", launcher="torchrun",
                   shares=(Share(0, "127.20.0.4", (Proc(argv=("python", "x.py")),)),),
                   elastic=True, join_template=Proc(argv=("run", "{address}")))
    assert JobSpec.from_json(spec.to_json()) == spec
    assert join_share(spec.join_template, 3, "127.20.128.9").procs[0].argv == (
        "run", "127.20.128.9")
    data = json.loads(spec.to_json())
    data["job_id"] = "../etc"
    with pytest.raises(JobSpecError, match="invalid job id"):
        JobSpec.from_json(json.dumps(data))


def test_membership_errors_name_the_file(tmp_path) -> None:
    m = build_membership(cluster_id="c", generation=1,
                         master={"instance_id": "i-m", "address": "127.20.0.4"},
                         workers=[{"instance_id": "i-w", "address": "127.20.128.10"},
                                  {"instance_id": "i-v", "address": "127.20.128.9"}])
    assert [n.address for n in m.nodes] == ["127.20.0.4", "127.20.128.9", "127.20.128.10"]
    path = tmp_path / "membership.json"
    data = json.loads(m.to_json())
    data["generation"] = 0
    path.write_text(json.dumps(data))
    from bootstrap_scripts.protocol.membership import Membership

    with pytest.raises(MembershipError) as err:
        Membership.load(path)
    assert str(path) in str(err.value) and "generation must be >= 1" in str(err.value)
    assert os.fspath(path) == err.value.source
