"""The executor's SIGTERM -> SIGKILL delay when a share is stopped: the job's ``--grace``,
except a stop of an attempt the controller found hung (``hang_rules.stop_grace``); and the
cancel marker read as before (no link, the directory owner's file)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from bootstrap_scripts.jobs.engine import hang_rules
from bootstrap_scripts.jobs.engine.userfiles import cancel_text
from bootstrap_scripts.jobs.executor.node import ThisNode
from bootstrap_scripts.jobs.executor.running import RunningShare
from bootstrap_scripts.jobs.executor.shares import Shares
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.jobs import JobSpec, Proc, Share
from bootstrap_scripts.protocol.paths import ClusterPaths, NodePaths


def test_the_cancel_markers_text(tmp_path):
    path = tmp_path / "cancel"
    assert cancel_text(path) is None
    path.write_text("hang: no progress\n")
    assert cancel_text(path) == "hang: no progress\n"
    path.write_text("x" * 5000)  # oversized: still a marker, without a reason
    assert cancel_text(path) == ""
    path.unlink()
    (tmp_path / "elsewhere").write_text("hang: planted\n")
    path.symlink_to(tmp_path / "elsewhere")
    assert cancel_text(path) is None  # a link is no marker (as userfiles.exists says)


@pytest.mark.parametrize(("cancel", "killed_after"), [
    ("hang: no progress on any rank for 10 s\n", hang_rules.HANG_STOP_GRACE),
    ("a node failed 1 s ago\n", 5.0),
])
def test_a_hang_stop_is_killed_after_the_short_grace(tmp_path, monkeypatch, cancel,
                                                     killed_after):
    paths = ClusterPaths(tmp_path).job("j.1")
    paths.nodes.mkdir(parents=True)
    spec = JobSpec(job_id="j.1", launcher="torchrun", grace_seconds=5.0,
                   shares=(Share(0, "10.0.0.4", (Proc(argv=("torchrun",)),)),))
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        shares = Shares(ThisNode(NodePaths(tmp_path / "node"), ClusterPaths(tmp_path),
                                 address="10.0.0.4"))
        r = RunningShare(spec, spec.shares[0], paths, pgid=0,
                         procs=[], started_at=time.monotonic())
        r.procs = [type("P", (), {"proc": spec.shares[0].procs[0], "popen": proc})()]
        shares.running[paths.key] = r
        store.atomic_write(paths.cancel, cancel)
        now = clock = time.monotonic()
        monkeypatch.setattr(time, "monotonic", lambda: clock)
        shares.supervise()
        assert r.cancel_reason and r.term_sent == now and not r.kill_sent
        clock = now + killed_after - 0.2
        shares.supervise()
        assert not r.kill_sent  # still within its grace
        clock = now + killed_after + 0.2
        shares.supervise()
        assert r.kill_sent and r.grace == killed_after
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
