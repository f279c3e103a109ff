"""An OOM-killed rank says so (``executor/oom.py``, ``Shares.finish``): the node's
``oom_kill`` counter (``/proc/vmstat``) read as a share starts and as it ends; a failed share
during which it rose names the kernel's OOM killer in its exit's reason."""

from __future__ import annotations

import pytest

from bootstrap_scripts.jobs.executor import oom
from bootstrap_scripts.jobs.executor.node import ThisNode
from bootstrap_scripts.jobs.executor.running import RunningShare
from bootstrap_scripts.jobs.executor.shares import Shares
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.jobs import JobSpec, Proc, Share
from bootstrap_scripts.protocol.paths import ClusterPaths, NodePaths
from bootstrap_scripts.protocol.records import ShareExit

VMSTAT = "nr_free_pages 12345\npgfault 999\noom_kill 7\nthp_fault_alloc 0\n"


def test_the_counter_is_read_from_vmstat():
    assert oom.parse_oom_kills(VMSTAT) == 7
    assert oom.parse_oom_kills("nr_free_pages 1\n") is None  # a kernel without it
    assert oom.oom_kills() is not None  # this machine's (Linux 4.13+)


@pytest.mark.parametrize(("before", "after", "rc", "says"), [
    (7, 8, 1, "killed 1 process on this node"),  # torchrun's exit 1 after a worker's OOM
    (7, 9, -9, "killed 2 processes on this node"),
    (7, 7, 1, ""),  # a code failure: the counter did not move
    (7, 8, 0, ""),  # succeeded: someone else's process
    (None, 8, 1, ""), (7, None, 1, ""),  # not known
])
def test_a_failed_share_names_the_oom_killer_only_when_it_ran(before, after, rc, says):
    reason = oom.oom_reason(before, after, rc)
    assert (says in reason) if says else reason == ""
    if says:
        assert "out of memory" in reason


def test_the_exit_record_says_it(tmp_path, monkeypatch):
    node = ThisNode(NodePaths(tmp_path / "node"), ClusterPaths(tmp_path / "efs"), "10.0.0.5")
    spec = JobSpec(job_id="j.1", launcher="each",
                   shares=(Share(0, "10.0.0.5", (Proc(argv=("python",)),)),))
    paths = ClusterPaths(tmp_path / "efs").job("j.1")
    paths.nodes.mkdir(parents=True)
    r = RunningShare(spec, spec.shares[0], paths, 0, [], 0.0, oom_kills=7)
    monkeypatch.setattr(oom, "oom_kills", lambda: 8)
    Shares(node).finish(r, 1)
    rec = store.read_record(paths.exit(0), ShareExit)
    assert rec is not None and "OOM killer killed 1 process" in rec.reason, rec
