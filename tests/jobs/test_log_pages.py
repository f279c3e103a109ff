"""``dl-jobs logs ID --cursor C`` (bootstrap_scripts/jobs/cli/log_pages.py): pages of a
managed job's output from a cursor with one offset per file, on real files written while
they are read. Every line is handed out exactly once, whole, in its file's order."""

from __future__ import annotations

import json
import os
import random
import re
from pathlib import Path

import pytest

from bootstrap_scripts.jobs.cli import dl_jobs
from bootstrap_scripts.jobs.cli.log_pages import (
    MAX_LINE_BYTES,
    PAGE_BYTES,
    Cursor,
    read_page,
)
from bootstrap_scripts.jobs.engine import managed
from bootstrap_scripts.protocol.managed_records import ManagedJob, RestartRecord
from bootstrap_scripts.protocol.paths import ClusterPaths

JOB = "pages-1"


def make_job(efs: Path, **fields) -> None:
    paths = ClusterPaths(efs).managed(JOB)
    paths.dir.mkdir(parents=True, exist_ok=True)
    paths.request.write_text("{}")  # submitted (find() needs it); the record is job.json
    managed.save_job(paths, ManagedJob(job_id=JOB, **fields))


def nodes_dir(efs: Path, attempt: int) -> Path:
    d = ClusterPaths(efs).job(ClusterPaths(efs).managed(JOB).attempt_id(attempt)).nodes
    d.mkdir(parents=True, exist_ok=True)
    return d


def drain(efs: Path, cursor: Cursor, out: list[str], err: list[str],
          ranks: frozenset[int] | None = None) -> tuple[Cursor, bool]:
    """Read pages until one is not full (as ``dlc logs`` does)."""
    while True:
        page = read_page(efs, JOB, cursor, ranks=ranks)
        assert page.used <= PAGE_BYTES
        out += page.out
        err += page.err
        cursor = Cursor.parse(page.cursor.encode())  # through its text, as dlc keeps it
        if not page.more:
            return cursor, page.done


def test_three_growing_node_logs_every_line_exactly_once(tmp_path: Path) -> None:
    """Three nodes write numbered lines in random pieces (lines cut anywhere, several pages'
    worth) while a reader pages through them; then the job ends with an unterminated line."""
    make_job(tmp_path, state="running", attempt=1)
    d = nodes_dir(tmp_path, 1)
    rng = random.Random(7)
    out: list[str] = []
    cursor, done = Cursor(), False
    pending = {r: "".join(f"n={r}:{i}\n" for i in range(3000)).encode() for r in range(3)}
    while any(pending.values()):
        for r in range(3):
            cut = rng.randint(1, 900)
            piece, pending[r] = pending[r][:cut], pending[r][cut:]
            with open(d / f"{r}.log", "ab") as fh:
                fh.write(piece)
        cursor, done = drain(tmp_path, cursor, out, [])
        assert not done
    with open(d / "2.log", "ab") as fh:
        fh.write(b"n=2:last")  # no newline: held while the job runs
    cursor, done = drain(tmp_path, cursor, out, [])
    assert not done and not any(line.endswith("n=2:last") for line in out)
    make_job(tmp_path, state="succeeded", attempt=1)
    cursor, done = drain(tmp_path, cursor, out, [])
    assert done
    seen: dict[tuple[int, int], int] = {}
    order: dict[int, list[int]] = {0: [], 1: [], 2: []}
    for line in out:
        m = re.fullmatch(r"\[(\d)\] n=(\d):(\d+|last)", line)
        assert m and m.group(1) == m.group(2), line
        if m.group(3) == "last":
            continue
        key = (int(m.group(2)), int(m.group(3)))
        seen[key] = seen.get(key, 0) + 1
        order[key[0]].append(key[1])
    assert seen == {(r, i): 1 for r in range(3) for i in range(3000)}
    assert all(v == sorted(v) for v in order.values())
    assert out.count("[2] n=2:last") == 1
    assert read_page(tmp_path, JOB, cursor).out == []  # nothing after the end


def test_attempts_in_turn_with_the_restart_line_once(tmp_path: Path) -> None:
    make_job(tmp_path, state="running", attempt=1)
    (nodes_dir(tmp_path, 1) / "0.log").write_bytes(b"a1 line\npartial of a1")
    out: list[str] = []
    err: list[str] = []
    cursor, done = drain(tmp_path, Cursor(), out, err)
    assert out == ["[0] a1 line"] and not done
    runner = ClusterPaths(tmp_path).managed(JOB).attempt_log(1)
    runner.parent.mkdir(parents=True, exist_ok=True)
    runner.write_bytes(b"[dl-run] attempt 1 lost a node\n")
    (nodes_dir(tmp_path, 2) / "0.log").write_bytes(b"a2 line\n")
    make_job(tmp_path, state="running", attempt=2, restarts=1, restart_log=(
        RestartRecord(attempt=1, at=1.0, kind="node-lost", detail="gone"),))
    cursor, done = drain(tmp_path, cursor, out, err)
    assert out == ["[0] a1 line", "[0] partial of a1", "[0] a2 line"]
    assert err[0] == "[dl-run] attempt 1 lost a node"
    assert len(err) == 2 and "restart 1 of job pages-1 after attempt 1: node-lost" in err[1]
    assert cursor.attempt == 2 and not done
    cursor, done = drain(tmp_path, cursor, out, err)
    assert len(out) == 3 and len(err) == 2


def test_one_rank_only_and_a_long_line_cut(tmp_path: Path) -> None:
    make_job(tmp_path, state="failed", attempt=1)
    d = nodes_dir(tmp_path, 1)
    (d / "0.log").write_bytes(b"x" * (MAX_LINE_BYTES * 2 + 5) + b"\n")
    (d / "1.log").write_bytes(b"one\n")
    out: list[str] = []
    _, done = drain(tmp_path, Cursor(), out, [], ranks=frozenset({0}))
    assert done and [len(line) for line in out] == [4 + MAX_LINE_BYTES] * 2 + [4 + 5]


def test_a_symbolic_link_is_not_followed(tmp_path: Path) -> None:
    """The page is read as root; a user's link to a file they cannot read gives nothing."""
    make_job(tmp_path, state="succeeded", attempt=1)
    secret = tmp_path / "secret"
    secret.write_text("root only\n")
    os.symlink(secret, nodes_dir(tmp_path, 1) / "0.log")
    out: list[str] = []
    _, done = drain(tmp_path, Cursor(), out, [])
    assert done and out == []


@pytest.mark.parametrize("text", ["0", "x", "1:0.log=3", "1:0=-1", "1:a=1", "1:0=1;rm"])
def test_cursor_refused(text: str) -> None:
    with pytest.raises(ValueError, match="cursor"):
        Cursor.parse(text)


def test_cursor_round_trip_and_the_command(tmp_path: Path, capsys) -> None:
    c = Cursor(3, {"0": 12, "1-ps": 4, "0-rdzv-store": 7, "r": 9})
    assert Cursor.parse(c.encode()) == c and Cursor.parse("2") == Cursor(2)
    make_job(tmp_path, state="succeeded", attempt=1)
    (nodes_dir(tmp_path, 1) / "0.log").write_bytes("é\n".encode())
    assert dl_jobs.main(["--mount-point", str(tmp_path), "logs", JOB, "--cursor", "1"]) == 0
    page = json.loads(capsys.readouterr().out)
    assert page == {"cursor": "1:0=3", "state": "succeeded", "done": True,
                    "more": False, "out": ["[0] é"], "err": []}
    assert dl_jobs.main(["--mount-point", str(tmp_path), "logs", JOB, "--cursor", "1;"]) == 2


def test_a_helpers_labelled_log_is_read_too(tmp_path: Path) -> None:
    """``<rank>-<label>.log`` (the rendezvous store's ``0-rdzv-store.log``) has its own
    offset in the cursor."""
    make_job(tmp_path, state="succeeded", attempt=1)
    d = nodes_dir(tmp_path, 1)
    (d / "0.log").write_bytes(b"train\n")
    (d / "0-rdzv-store.log").write_bytes(b"store up\n")
    page = read_page(tmp_path, JOB, Cursor())
    assert page.out == ["[0-rdzv-store] store up", "[0] train"] and page.done
    assert page.cursor.offsets == {"0": 6, "0-rdzv-store": 9}
