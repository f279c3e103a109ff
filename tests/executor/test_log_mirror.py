"""The executor's copy of its shares' output for the CloudWatch agent
(bootstrap_scripts/jobs/executor/log_mirror.py): whole lines only while a share runs, the
rest once it ended, each line prefixed with its job and node, links never followed."""

from __future__ import annotations

import os

from bootstrap_scripts.jobs.executor.log_mirror import LogMirror, jobs_log, share_sources


def sources(tmp_path, job: str = "j1.1"):
    nodes = tmp_path / "efs/jobs" / job / "nodes"
    nodes.mkdir(parents=True, exist_ok=True)
    return nodes, share_sources(job, nodes, "10.0.0.5", [(1, "", "1.log"), (1, "ps", "1-ps.log")])


def test_whole_lines_while_running_the_rest_when_ended(tmp_path) -> None:
    nodes, (main, ps) = sources(tmp_path)
    mirror = LogMirror(tmp_path / "root")
    (nodes / "1.log").write_text("epoch=1\nepo")
    (nodes / "1-ps.log").write_text("ps up\n")
    assert mirror.follow([main, ps]) == 2
    with open(nodes / "1.log", "a") as f:
        f.write("ch=2\nlast")
    assert mirror.follow([main, ps]) == 1
    assert mirror.follow([]) == 1  # ended: "last" without its newline
    assert mirror.offsets == {}
    assert jobs_log(tmp_path / "root").read_text().splitlines() == [
        "j1.1 [1 10.0.0.5] epoch=1", "j1.1 [1 10.0.0.5 ps] ps up",
        "j1.1 [1 10.0.0.5] epoch=2", "j1.1 [1 10.0.0.5] last"]


def test_a_link_planted_as_the_log_is_not_read(tmp_path) -> None:
    nodes, (main, _ps) = sources(tmp_path)
    secret = tmp_path / "secret"
    secret.write_text("root only\n")
    os.symlink(secret, nodes / "1.log")
    mirror = LogMirror(tmp_path / "root")
    assert mirror.follow([main]) == 0
    assert mirror.follow([]) == 0
    assert not jobs_log(tmp_path / "root").exists()


def test_a_missing_log_waits(tmp_path) -> None:
    nodes, (main, _ps) = sources(tmp_path)
    mirror = LogMirror(tmp_path / "root")
    assert mirror.follow([main]) == 0
    (nodes / "1.log").write_text("late\n")
    assert mirror.follow([main]) == 1
