"""Membership building and the files every node renders from it (golden files)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bootstrap_scripts.agent.node_files import applied_generation, apply_membership
from bootstrap_scripts.protocol.membership import Membership, MembershipError, build_membership
from bootstrap_scripts.protocol.node_files import HOSTS_BEGIN, parse_env_file
from bootstrap_scripts.protocol.paths import (
    ENV_FILE,
    HOROVOD_HOSTS_FILE,
    HOSTS_FILE,
    MEMBERSHIP_FILE,
    MPI_HOSTFILE,
    PROFILE_FILE,
    WORKERS_FILE,
)

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"


def make(generation: int = 1, workers: list[tuple[str, str, int]] | None = None,
         reason: str = "initial") -> Membership:
    if workers is None:
        workers = [("i-w9", "10.0.128.9", 8), ("i-w10", "10.0.128.10", 8),
                   ("i-w2", "10.0.128.2", 4)]
    return build_membership(
        cluster_id="dlc", generation=generation,
        master={"instance_id": "i-m", "address": "10.0.0.5", "gpus": 8,
                "instance_type": "p4d.24xlarge"},
        workers=[{"instance_id": i, "address": a, "gpus": g, "instance_type": "p4d.24xlarge"}
                 for i, a, g in workers],
        efs_mount="/efs", created_at="2026-11-21T20:00:00Z", reason=reason)


def test_master_first_then_workers_in_numeric_address_order():
    m = make()
    assert [n.address for n in m.nodes] == ["10.0.0.5", "10.0.128.2", "10.0.128.9",
                                            "10.0.128.10"]
    assert [n.rank for n in m.nodes] == [0, 1, 2, 3]
    assert [n.alias for n in m.nodes] == [f"deeplearning-worker{i}" for i in range(1, 5)]
    assert m.master.role == "master" and {n.role for n in m.nodes[1:]} == {"worker"}


def test_master_listed_among_workers_appears_once():
    m = build_membership(cluster_id="c", generation=1,
                            master={"instance_id": "i-m", "address": "10.0.0.5"},
                            workers=[{"instance_id": "i-m", "address": "10.0.0.5"},
                                     {"instance_id": "i-w", "address": "10.0.0.6"}])
    assert [n.instance_id for n in m.nodes] == ["i-m", "i-w"]


def test_alias_that_disagrees_with_the_rank_is_rejected():
    data = make().to_dict()
    data["nodes"][1]["alias"] = "deeplearning-worker0"  # numbered from 0: loops miss a node
    with pytest.raises(MembershipError, match=r"10\.0\.128\.2.*'deeplearning-worker2'"):
        Membership.from_dict(data)


def test_duplicate_address_is_rejected_with_the_address_named():
    with pytest.raises(MembershipError, match=r"10\.0\.0\.6"):
        build_membership(cluster_id="c", generation=1,
                            master={"instance_id": "i-m", "address": "10.0.0.5"},
                            workers=[{"instance_id": "i-a", "address": "10.0.0.6"},
                                     {"instance_id": "i-b", "address": "10.0.0.6"}])


@pytest.mark.parametrize("rel", [WORKERS_FILE, MPI_HOSTFILE, HOROVOD_HOSTS_FILE,
                                 MEMBERSHIP_FILE, ENV_FILE, PROFILE_FILE,
                                 HOSTS_FILE])
def test_rendered_files_match_golden(rel, tmp_path):
    m = make()
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc/hosts").write_text("127.0.0.1 localhost\n::1 localhost ip6-localhost\n")
    result = apply_membership(root, m, instance_id="i-w2")
    assert result.status == "applied"
    text = (root / rel).read_text().replace(str(root), "<ROOT>")
    golden = GOLDEN / (rel.replace("/", "__") + ".golden")
    if UPDATE:
        golden.write_text(text)
    assert golden.exists(), f"missing golden {golden}; run with UPDATE_GOLDEN=1"
    assert text == golden.read_text()


def test_env_and_profile_export_the_original_variables_and_ours(tmp_path):
    apply_membership(tmp_path, make(), instance_id="i-w9")
    env = parse_env_file((tmp_path / ENV_FILE).read_text())
    assert env["DEEPLEARNING_WORKERS_PATH"] == str(tmp_path / WORKERS_FILE)
    assert env["DEEPLEARNING_WORKERS_COUNT"] == "4"
    assert env["DEEPLEARNING_WORKER_GPU_COUNT"] == "8"
    assert env["EFS_MOUNT"] == "/efs"
    assert env["DEEPLEARNING_MASTER_ADDR"] == "10.0.0.5"
    assert env["DEEPLEARNING_NODE_RANK"] == "2"
    profile = (tmp_path / PROFILE_FILE).read_text()
    for key, value in env.items():
        assert f"export {key}={value}\n" in profile
    assert (tmp_path / WORKERS_FILE).read_text().count("\n") == 4


def _mtimes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns
            for p in root.rglob("*") if p.is_file()}


def test_applying_the_same_generation_twice_changes_no_file(tmp_path):
    m = make()
    assert apply_membership(tmp_path, m, instance_id="i-m").status == "applied"
    past = 1_000_000_000
    for p in tmp_path.rglob("*"):
        if p.is_file():
            os.utime(p, ns=(past, past))
    before = _mtimes(tmp_path)
    again = apply_membership(tmp_path, m, instance_id="i-m")
    assert again.status == "unchanged" and again.changed == []
    assert _mtimes(tmp_path) == before
    assert not [p for p in tmp_path.rglob("*.tmp")], "temp files left behind"


def test_newer_generation_replaces_files_and_older_is_ignored(tmp_path):
    apply_membership(tmp_path, make(1), instance_id="i-m")
    newer = make(2, workers=[("i-w9", "10.0.128.9", 8), ("i-w11", "10.0.128.11", 8)],
                 reason="membership-change")
    result = apply_membership(tmp_path, newer, instance_id="i-m")
    assert result.status == "applied"
    assert (tmp_path / WORKERS_FILE).read_text() == "10.0.0.5\n10.0.128.9\n10.0.128.11\n"
    assert applied_generation(tmp_path) == 2
    stale = apply_membership(tmp_path, make(1), instance_id="i-m")
    assert stale.status == "older"
    assert applied_generation(tmp_path) == 2
    assert (tmp_path / WORKERS_FILE).read_text() == "10.0.0.5\n10.0.128.9\n10.0.128.11\n"


def test_the_generation_a_caller_holds_decides_without_parsing_the_applied_file(tmp_path):
    """The node agent passes the generation it applied (``applied``): the local
    membership is not parsed again on every apply; were it, this garbled one reads as 0."""
    apply_membership(tmp_path, make(2), instance_id="i-m")
    (tmp_path / MEMBERSHIP_FILE).write_text("garbled")
    assert applied_generation(tmp_path) == 0
    assert apply_membership(tmp_path, make(1), instance_id="i-m", applied=2).status == "older"
    assert apply_membership(tmp_path, make(3), instance_id="i-m", applied=2).status == "applied"
    assert applied_generation(tmp_path) == 3


def test_node_not_in_membership_writes_nothing(tmp_path):
    result = apply_membership(tmp_path, make(), instance_id="i-stranger")
    assert result.status == "not-a-member"
    assert not any(tmp_path.iterdir())


def test_hosts_block_is_replaced_not_appended(tmp_path):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/hosts").write_text("127.0.0.1 localhost\n10.9.9.9 mine\n")
    apply_membership(tmp_path, make(1), instance_id="i-m")
    apply_membership(tmp_path, make(2, workers=[("i-w3", "10.0.128.3", 1)]), instance_id="i-m")
    text = (tmp_path / "etc/hosts").read_text()
    assert text.startswith("127.0.0.1 localhost\n10.9.9.9 mine\n")
    assert text.count(HOSTS_BEGIN) == 1
    assert "10.0.0.5 deeplearning-worker1 deeplearning-master\n" in text
    assert "10.0.128.3 deeplearning-worker2\n" in text
    assert "10.0.128.9" not in text
