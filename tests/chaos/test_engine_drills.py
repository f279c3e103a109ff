"""Fault drills on the job engine, all on the one shared emulated cluster (conftest).

Real processes throughout: the nodes' ``dl-executor`` and the master's ``dl-controller``
(the installed units' commands), managed jobs submitted with the master's ``dl-run`` and
run by ``tests/chaos/jobs/numbered.py`` on both nodes. The one emulated delay is systemd's:
a killed daemon is started again after its unit's ``RestartSec`` (:data:`RESTART_SEC`).
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bootstrap_scripts.jobs.controller import retention
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.managed_records import ControllerHeartbeat
from bootstrap_scripts.protocol.paths import ClusterPaths, NodePaths
from bootstrap_scripts.protocol.records import ShareStarted
from emulator.nodes import base_env
from tests.chaos.drills import (
    JOB,
    attempts,
    completions,
    drill,
    leftovers,
    line_numbers,
    lines_ok,
    record,
    torchelastic_dirs,
    wait_for,
)
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.chaos
#: The units' ``RestartSec=5`` (bootstrap_scripts/agent/install.py): systemd's delay before
#: it starts a killed daemon again, played here by the test.
RESTART_SEC = 5.0
#: Lines (0.2 s apart) of a job killed into: it must outlast the restart delay plus the
#: runner's ``--fail-grace`` (10 s) after a share is lost, or rank 0 finishes its part in
#: the attempt that is then restarted (and completes twice, as a resumed job would).
LONG_JOB_LINES = 120
TERMINAL = ("succeeded", "failed", "cancelled")
RANKS = 2


def submit(c, *args: str) -> str:
    res = c.run("--detach", "--json", "--launcher", "each", "--", "python", JOB, *args,
                managed=True, timeout=60)
    assert res.returncode == 0, res.stdout
    return json.loads(res.stdout.strip().splitlines()[-1])["job_id"]


def status_dir(root: Path) -> Path:
    return NodePaths(root).share_status_dir


def finished(c, job_id: str, timeout: float = 180):
    return wait_for(f"job {job_id} to end: {c.controller_log()[-2000:]}",
                    lambda: (r := record(c.efs, job_id)) and r.state in TERMINAL and r, timeout)


def printed(c, job_id: str, rank: int, n: int) -> bool:
    """Attempt 1's rank ``rank`` printed at least ``n`` lines."""
    tries = attempts(c.efs, job_id)
    return bool(tries) and len(line_numbers(store.read_text(tries[0].log(rank)) or "")) >= n


def nothing_left(c, row, job_id: str, elastic: set[str]) -> None:
    left = wait_for_empty(lambda: leftovers(c.efs, job_id, c.roots, status_dir, elastic))
    row.check("nothing left", not left, "; ".join(left[:4]))


def wait_for_empty(get, timeout: float = 15.0) -> list[str]:
    """What ``get`` lists once it is empty, or after ``timeout`` (processes take a moment
    to be reaped)."""
    deadline = time.monotonic() + timeout
    while (left := get()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def daemons_alive(c) -> bool:
    return all(p.poll() is None for p in c.executors.values()) and \
        c.controller is not None and c.controller.poll() is None


def restarts_text(rec) -> str:
    return ", ".join(f"{r.kind}@{r.attempt}" for r in rec.restart_log) or "no restart"


# -- (b) a garbled queued request ----------------------------------------------------------


def test_b_garbled_request(chaos_cluster):
    c = chaos_cluster
    with drill("(b) garbled request.json", "a queued managed job's request.json cut "
               "mid-JSON") as row:
        job_id = "garbled-b"
        mdir = ClusterPaths(c.efs).managed(job_id).dir
        mdir.mkdir(parents=True)
        t0 = time.monotonic()
        (mdir / "request.json").write_text('{"job_id": "garbled-b", "run": ')
        rec = finished(c, job_id, 30)
        row.seconds = time.monotonic() - t0
        shown = c.dl_jobs("show", job_id, "--json")
        listed = json.loads(shown.stdout) if shown.returncode == 0 else {}
        row.did = f"job.json {rec.state}: {rec.message[:70]}; dl-jobs: {listed.get('state')}"
        row.check("record", rec.state == "failed" and "request.json" in rec.message
                  and rec.finished_at and listed.get("state") == "failed", rec.message)
        row.check("once", not attempts(c.efs, job_id), "an attempt ran")
        row.check("daemons up", daemons_alive(c))
        nothing_left(c, row, job_id, torchelastic_dirs())


# -- (c) kill -9 of an executor mid-job ----------------------------------------------------


def _executor_kill(c, row, *, wrapper_too: bool) -> None:
    elastic = torchelastic_dirs()
    n = LONG_JOB_LINES
    job_id = submit(c, "--lines", str(n))
    wait_for("rank 1 to print 5 lines", lambda: printed(c, job_id, 1, 5), 60)
    addr = c.addresses[1]
    log_from = len(c.executor_log(addr))
    first = attempts(c.efs, job_id)[0]
    t0 = time.monotonic()
    c.executors[addr].send_signal(signal.SIGKILL)
    c.executors[addr].wait(10)
    if wrapper_too:  # the share's wrapper, the one process that knew its exit status
        started = store.read_record(first.started(1), ShareStarted)
        os.kill(started.pids[0], signal.SIGKILL)
    time.sleep(RESTART_SEC)
    c.start_executors([addr])
    if wrapper_too:  # the share is lost: running again = the next attempt printing
        wait_for("the next attempt to run", lambda: len(attempts(c.efs, job_id)) > 1
                 and printed_in(c, attempts(c.efs, job_id)[-1]), 120)
    else:  # the share never stopped: running again = its executor follows it again
        wait_for("the executor to re-attach",
                 lambda: "re-attached" in c.executor_log(addr)[log_from:], 120)
    row.seconds = time.monotonic() - t0
    rec = finished(c, job_id)
    kinds = {r.kind for r in rec.restart_log}
    row.did = (f"{rec.state}, attempt {rec.attempt}, {restarts_text(rec)}"
               + ("; executor re-attached" if "re-attached" in c.executor_log(addr)[log_from:]
                  else ""))
    reattached = rec.attempt == 1 and not rec.restart_log
    infra = bool(kinds) and kinds <= {"executor-restarted", "runner-lost"}
    row.check("record", rec.state == "succeeded" and (reattached or infra)
              and "code" not in kinds, f"{rec.state} {restarts_text(rec)} {rec.last_failure}")
    row.check("once", completions(c.efs, job_id, RANKS) == 1,
              f"{completions(c.efs, job_id, RANKS)} completion lines")
    ok, detail = lines_ok(c.efs, job_id, RANKS, n, reattached=reattached)
    row.check("lines", ok, detail)
    row.check("daemons up", daemons_alive(c))
    nothing_left(c, row, job_id, elastic)


def printed_in(c, attempt) -> bool:
    return all(line_numbers(store.read_text(attempt.log(r)) or "") for r in range(RANKS))


def test_c_executor_killed_mid_job(chaos_cluster):
    with drill("(c) executor kill -9", f"kill -9 of node 1's dl-executor mid-job, started "
               f"again {RESTART_SEC:g} s later") as row:
        _executor_kill(chaos_cluster, row, wrapper_too=False)


def test_c2_executor_and_share_wrapper_killed(chaos_cluster):
    with drill("(c2) executor + share wrapper kill -9", "kill -9 of node 1's dl-executor "
               "and of its share's wrapper; executor started again") as row:
        _executor_kill(chaos_cluster, row, wrapper_too=True)


def test_c3_attempt_runner_killed(chaos_cluster):
    """The attempt's runner (``dl-run --unmanaged``, the controller's child) is killed while
    the controller lives: the executors stop the orphaned shares once its heartbeat stops,
    the controller classifies the attempt ``runner-lost`` (infrastructure) and restarts it."""
    c = chaos_cluster
    with drill("(c3) attempt runner kill -9", "kill -9 of the attempt's runner (dl-run "
               "--unmanaged) mid-job, controller and executors untouched") as row:
        elastic = torchelastic_dirs()
        n = LONG_JOB_LINES
        job_id = submit(c, "--lines", str(n))
        wait_for("rank 0 to print 5 lines", lambda: printed(c, job_id, 0, 5), 60)
        runners = c.attempt_runners()
        assert len(runners) == 1, runners
        t0 = time.monotonic()
        for pid in runners:
            os.kill(pid, signal.SIGKILL)
        wait_for("the next attempt to run", lambda: len(attempts(c.efs, job_id)) > 1
                 and printed_in(c, attempts(c.efs, job_id)[-1]), 120)
        row.seconds = time.monotonic() - t0
        rec = finished(c, job_id)
        kinds = {r.kind for r in rec.restart_log}
        row.did = f"{rec.state}, attempt {rec.attempt}, {restarts_text(rec)}"
        row.check("record", rec.state == "succeeded" and kinds == {"runner-lost"},
                  f"{rec.state} {restarts_text(rec)} {rec.last_failure}")
        row.check("once", completions(c.efs, job_id, RANKS) == 1,
                  f"{completions(c.efs, job_id, RANKS)} completion lines")
        ok, detail = lines_ok(c.efs, job_id, RANKS, n, reattached=False)
        row.check("lines", ok, detail)
        row.check("daemons up", daemons_alive(c))
        nothing_left(c, row, job_id, elastic)


# -- (h) kill -9 of the controller mid-job -------------------------------------------------


def test_h_controller_killed_mid_job(chaos_cluster):
    c = chaos_cluster
    with drill("(h) controller kill -9", f"kill -9 of dl-controller mid-job, started again "
               f"{RESTART_SEC:g} s later") as row:
        elastic = torchelastic_dirs()
        n = LONG_JOB_LINES
        job_id = submit(c, "--lines", str(n))
        wait_for("rank 0 to print 5 lines", lambda: printed(c, job_id, 0, 5), 60)
        log_from = len(c.controller_log())
        t0 = time.monotonic()
        c.controller.send_signal(signal.SIGKILL)
        c.controller.wait(10)
        time.sleep(RESTART_SEC)
        c.start_controller()
        wait_for("the controller to take the job back",
                 lambda: "re-attaching" in c.controller_log()[log_from:]
                 or len(attempts(c.efs, job_id)) > 1, 60)
        row.seconds = time.monotonic() - t0
        rec = finished(c, job_id)
        row.did = (f"{rec.state}, attempt {rec.attempt}, {restarts_text(rec)}"
                   + ("; re-attached" if "re-attaching" in c.controller_log()[log_from:]
                      else ""))
        row.check("record", (rec.state, rec.attempt, rec.restart_log) == ("succeeded", 1, ())
                  and rec.controller.endswith(f"/{c.controller.pid}"),
                  f"{rec.state} {restarts_text(rec)}")
        row.check("once", completions(c.efs, job_id, RANKS) == 1)
        ok, detail = lines_ok(c.efs, job_id, RANKS, n, reattached=True)
        row.check("lines", ok, detail)
        row.check("daemons up", daemons_alive(c))
        nothing_left(c, row, job_id, elastic)


# -- (f) a second controller / executor beside the first -----------------------------------


def _second(argv: list[str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, cwd=REPO_ROOT, env=base_env(), capture_output=True,
                              text=True, timeout=60)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"a second {argv[2]} kept running beside the first") from exc


def test_f_second_controller_and_executor(chaos_cluster):
    c = chaos_cluster
    master = c.node(c.membership.master_addr)
    cluster = ClusterPaths(c.efs)
    for what, argv, says, first, beat_path in (
            ("controller", [sys.executable, "-m", "bootstrap_scripts.jobs.controller",
                            "--root", str(master.root), "--mount-point", str(c.efs),
                            "--no-health-gate"], "another job controller", c.controller,
             cluster.controller_heartbeat),
            ("executor", [sys.executable, "-m", "bootstrap_scripts.jobs.executor", "--root",
                          str(master.root), "--mount-point", str(c.efs), "--no-mount",
                          "--address", master.address], "pid", c.executors[master.address],
             cluster.executor_heartbeat(master.address))):
        with drill(f"(f) second {what}", f"a second dl-{what} started on the master "
                   "beside the first") as row:
            beat = store.stamp(beat_path)
            t0 = time.monotonic()
            res = _second(argv)
            row.seconds = time.monotonic() - t0
            said = next((ln for ln in res.stderr.splitlines() if "ERROR" in ln), "")
            row.did = f"exit {res.returncode}: {said.partition(' ERROR ')[2][:100]}"
            row.check("refused", res.returncode != 0 and says in res.stderr
                      and f"pid {first.pid}" in res.stderr, res.stderr[-300:])
            moved = wait_for_moved(beat_path, beat)
            row.check("first unaffected", first.poll() is None and moved)
            if what == "controller":
                hb = store.read_record(ClusterPaths(c.efs).controller_heartbeat,
                                       ControllerHeartbeat)
                row.check("record", hb is not None and hb.pid == first.pid,
                          f"heartbeat pid {hb and hb.pid}")


def wait_for_moved(path: Path, before, timeout: float = 10.0) -> bool:
    """The heartbeat at ``path`` was written again after ``before`` (its stamp)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if store.stamp(path) not in (None, before):
            return True
        time.sleep(0.2)
    return False


# -- (d) EFS full --------------------------------------------------------------------------


def fill(path: Path) -> int:
    """Write ``path`` until the file system says ENOSPC; returns the bytes written."""
    written = 0
    chunk = b"\0" * (1 << 20)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        while True:
            try:
                written += os.write(fd, chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                if len(chunk) == 1:
                    return written
                chunk = chunk[: len(chunk) // 16 or 1]
    finally:
        os.close(fd)


def test_d_efs_full(chaos_cluster):
    c = chaos_cluster
    with drill("(d) EFS full", "the EFS file system (a tmpfs) filled to ENOSPC mid-job, "
               "freed 10 s later") as row:
        assert not getattr(c, "efs_mount_error", ""), \
            f"no tmpfs for EFS (needs root): {c.efs_mount_error}"
        elastic = torchelastic_dirs()
        job_id = submit(c, "--lines", "400", "--every", "0.05")
        wait_for("rank 0 to print 5 lines", lambda: printed(c, job_id, 0, 5), 60)
        log_from = len(c.controller_log())
        filler = c.efs / "filler"
        t0 = time.monotonic()
        size = fill(filler)
        try:
            wait_for("the controller to give up the job",
                     lambda: "EFS full" in c.controller_log()[log_from:], 60)
            row.seconds = time.monotonic() - t0
            time.sleep(10)  # full for a while: the daemons must ride it out
            alive_full = daemons_alive(c)
        finally:
            filler.unlink()
        rec = finished(c, job_id, 60)
        row.did = (f"filled {size >> 20} MiB; {rec.state}: {rec.message[:80]}; "
                   f"{restarts_text(rec)}")
        row.check("record", rec.state == "failed" and "EFS full" in rec.message, rec.message)
        row.check("once", completions(c.efs, job_id, RANKS) == 0)
        row.check("daemons up", alive_full and daemons_alive(c))
        nothing_left(c, row, job_id, elastic)
        after = submit(c, "--lines", "5")
        rec2 = finished(c, after, 120)
        row.check("recovered", rec2.state == "succeeded"
                  and completions(c.efs, after, RANKS) == 1,
                  f"the next job {rec2.state}: {rec2.message}")


# -- (g) 10,000 finished jobs --------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_cpu(efs: Path, root: Path, address: str, window: float = 8.0) -> float:
    """CPU seconds per second of a real idle ``dl-executor`` over ``efs``."""
    from bootstrap_scripts.node.procgroup import stop_popen_group

    p = subprocess.Popen([sys.executable, "-m", "bootstrap_scripts.jobs.executor", "--root",
                          str(root), "--mount-point", str(efs), "--no-mount", "--address",
                          address], cwd=REPO_ROOT, env=base_env(), stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         process_group=0)
    try:
        time.sleep(3.0)
        before, t0 = cpu_seconds(p.pid), time.monotonic()
        time.sleep(window)
        used, elapsed = cpu_seconds(p.pid) - before, time.monotonic() - t0
        assert p.poll() is None, "the idle executor exited"
    finally:
        stop_popen_group(p)
    return used / elapsed


def test_g_ten_thousand_finished_jobs(tmp_path):
    n = 10_000
    with drill("(g) 10,000 finished jobs", f"{n:,} finished job directories (and 100 "
               "managed records) 8 days old on EFS") as row:
        empty, full = tmp_path / "empty", tmp_path / "full"
        empty.mkdir()
        (full / "managed").mkdir(parents=True)
        old = time.time() - 8 * retention.DAY
        for k in range(n):
            d = ClusterPaths(full).job(f"old-{k:05d}").dir
            (d / "nodes").mkdir(parents=True)
            for name in ("spec.json", "runner.json", "result.json", "done"):
                (d / name).write_text("{}\n")
            (d / "nodes" / "0.exit").write_text("{}\n")
            os.utime(d / "done", (old, old))
        from bootstrap_scripts.jobs.engine import managed
        from bootstrap_scripts.protocol.managed_records import ManagedJob, ManagedRequest
        from bootstrap_scripts.protocol.run_request import RunRequest
        for k in range(100):
            jid = f"done-{k:03d}"
            req = ManagedRequest(job_id=jid, run=RunRequest(job_id=jid, command=("true",)),
                                 submitted_at=old)
            paths = managed.submit(full, req)
            managed.save_job(paths, ManagedJob(job_id=jid, state="succeeded",
                                               submitted_at=old, finished_at=old))
        cpu0 = idle_cpu(empty, tmp_path / "node0", "127.20.250.5")
        cpu1 = idle_cpu(full, tmp_path / "node1", "127.20.250.6")
        # retention, as the real controller does it at its first pass
        ctl = subprocess.Popen([sys.executable, "-m", "bootstrap_scripts.jobs.controller",
                                "--root", str(tmp_path / "master"), "--mount-point",
                                str(full), "--no-health-gate"], cwd=REPO_ROOT, env=base_env(),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               process_group=0)
        t0 = time.monotonic()
        try:
            archive = ClusterPaths(full).archive_dir
            wait_for("retention to archive them", lambda: not any(
                full.glob("jobs/*/*")) and not any(full.glob("managed/*/*")), 120)
            row.seconds = time.monotonic() - t0
            alive_after = ctl.poll() is None
        finally:
            from bootstrap_scripts.node.procgroup import stop_popen_group
            stop_popen_group(ctl)
        moved_jobs = len(list((archive / "jobs").glob("*/*")))
        moved_managed = len(list((archive / "managed").glob("*/*")))
        row.did = (f"idle dl-executor CPU: {1000 * cpu0:.1f} ms/s with 0 jobs, "
                   f"{1000 * cpu1:.1f} ms/s with {n:,}; the controller archived "
                   f"{moved_jobs:,} job dirs + {moved_managed} records")
        row.check("record", (moved_jobs, moved_managed) == (n, 100),
                  f"{moved_jobs} / {moved_managed} archived")
        row.check("controller up", alive_after)
        row.check("nothing left", not list(full.rglob("*.tmp")))
