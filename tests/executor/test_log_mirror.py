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


def burst(path, mib: int) -> int:
    """``mib`` MiB of numbered lines (a share's output burst); the bytes written."""
    line = "x" * 1000
    with open(path, "w") as f:
        for k in range(mib * 1024):
            f.write(f"{k:08d} {line}\n")
    return path.stat().st_size


def test_an_ended_shares_burst_is_read_in_bounded_chunks(tmp_path) -> None:
    """20 MiB left unread when the share ended: each pass holds at most a chunk per file
    (never the whole rest), and every line arrives in the end."""
    import tracemalloc

    from bootstrap_scripts.jobs.executor import log_mirror

    nodes, (main, _ps) = sources(tmp_path)
    size = burst(nodes / "1.log", 20)
    mirror = LogMirror(tmp_path / "root")
    tracemalloc.start()
    try:
        mirror.follow([main])  # one pass while it ran, then it ended
        passes = 1
        while mirror.offsets:
            mirror.follow([])
            passes += 1
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * log_mirror.READ_LIMIT, peak  # a chunk and its lines, not 20 MiB
    copied = jobs_log(tmp_path / "root").read_text().splitlines()
    assert len(copied) == 20 * 1024 and passes >= size // log_mirror.PASS_LIMIT


def test_the_local_copy_is_capped_per_share_and_rotated(tmp_path, monkeypatch) -> None:
    from bootstrap_scripts.jobs.executor import log_mirror

    monkeypatch.setattr(log_mirror, "SOURCE_COPY_LIMIT", 3 * log_mirror.READ_LIMIT)
    monkeypatch.setattr(log_mirror, "FILE_LIMIT", 2 * log_mirror.READ_LIMIT)
    nodes, (main, _ps) = sources(tmp_path)
    burst(nodes / "1.log", 10)
    mirror = LogMirror(tmp_path / "root")
    for _ in range(20):
        mirror.follow([main])
    out = jobs_log(tmp_path / "root")
    old = out.with_name(out.name + ".1")
    total = out.stat().st_size + old.stat().st_size
    assert total < 2 * log_mirror.FILE_LIMIT + log_mirror.READ_LIMIT, total
    assert "the rest is not copied here (all of it: 1.log on EFS)" in out.read_text()
    mirror.follow([])
    assert mirror.offsets == {}


def test_a_line_longer_than_a_chunk_is_copied_in_pieces(tmp_path) -> None:
    from bootstrap_scripts.jobs.executor import log_mirror

    nodes, (main, _ps) = sources(tmp_path)
    (nodes / "1.log").write_text("y" * (log_mirror.READ_LIMIT + 10))  # no newline yet
    mirror = LogMirror(tmp_path / "root")
    assert mirror.follow([main]) == 1  # the first chunk, cut: the share runs on
    assert mirror.offsets[main] == log_mirror.READ_LIMIT
