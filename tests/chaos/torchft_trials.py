"""The torchft bench's harness (real processes): the torchft replica groups' trial with a
kill and a replacement, the full restart beside it, the load printed with each figure.

Shared by the torchft bench (``test_torchft_bench.py``, which says what each trial does) and
the goodput bench (``test_goodput.py``, which runs one in-place trial for its computed
projection); in its own module so neither test module imports the other.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from tests.chaos import torchft_figures as tf

ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).parent / "jobs" / "torchft_replica.py"
#: the torchft venv (``make torchft-setup``), or $TORCHFT_VENV
VENV = Path(os.environ.get("TORCHFT_VENV", ROOT / ".venv-torchft"))
FULL = 4
KILL_AT = 30
REPLACE_AFTER = 10
STEPS = 110
#: the goodput bench's pause per step (a GPU step's compute)
STEP_DELAY = 0.25
TRIALS = 3
#: the Lighthouse's settings: min_replicas 2 (the goodput bench's --min-nodes 2), its
#: default join timeout, and its heartbeat timeout as shipped (5 s) and at 1 s: the
#: survivors' quorum waits for the dead replica's heartbeat to expire
HEARTBEAT_TIMEOUTS_MS = (5000, 1000)
JOIN_TIMEOUT_MS = 60000


def torchft_python() -> str:
    """The venv's python if it imports torchft, else ''."""
    py = VENV / "bin" / "python"
    if not py.exists():
        return ""
    res = subprocess.run([str(py), "-c", "import torchft"], capture_output=True, timeout=120,
                         check=False)
    return str(py) if res.returncode == 0 else ""


def free_port() -> int:
    """A loopback port free now (the Lighthouse's, a process group's store)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_events(directory: Path) -> list[dict]:
    """Every process's event lines so far (a line being written is skipped)."""
    out = []
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
    return out


class Procs:
    """Every process the bench starts, each in its own session, stopped by group."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def start(self, argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
        with open(log, "ab") as f:
            p = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=env,
                                 cwd=ROOT, start_new_session=True)
        self.procs.append(p)
        return p

    def stop(self) -> None:
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)


def wait_until(what: str, cond: Callable[[], object], timeout: float = 240.0,
               procs: list[subprocess.Popen] | None = None) -> object:
    """``cond()``'s first true answer; fails naming ``what`` on the timeout or as soon as
    one of ``procs`` exits non-zero (a run that broke, not a slow one)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        for p in procs or ():
            assert p.poll() in (None, 0), f"a process exited {p.returncode} while waiting " \
                f"for {what}"
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def committed(events: list[dict], pid: int) -> int:
    """The highest step process ``pid`` committed (0: none yet)."""
    return max((e["step"] for e in tf.steps(events, pid=pid) if e["committed"]), default=0)


def job_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment without a launcher's variables, the checkout importable (the
    replica imports the example's data functions), Gloo on loopback only."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC", "RANK",
                                                                      "WORLD_SIZE", "MASTER"))}
    env.update({"PYTHONPATH": str(ROOT), "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"})
    env.update(extra or {})
    return env


def write_data(path: Path) -> None:
    """The example's training split (``digits_data.load_data``, seed 0), as tensors the
    torchft venv reads without numpy or scikit-learn."""
    import torch

    from bootstrap_scripts.examples.digits_data import load_data

    x, _xt, y, _yt = load_data(0, 0.2)
    torch.save({"x": torch.from_numpy(x), "y": torch.from_numpy(y)}, path)


def torchft_trial(py: str, tmp: Path, data: Path, name: str, heartbeat_ms: int
                  ) -> tuple[tf.Recovery, tf.Overhead | None]:
    """One in-place trial (module docstring, 1.): its recovery figures and the fault-free
    steps' overhead, from the processes' own event lines."""
    run = tmp / name
    run.mkdir()
    procs = Procs()
    port = free_port()
    lighthouse = f"http://127.0.0.1:{port}"
    env = job_env({"RUST_LOG": "warn"})
    try:
        procs.start([str(VENV / "bin" / "torchft_lighthouse"), "--bind", f"127.0.0.1:{port}",
                     "--min_replicas", "2", "--heartbeat_timeout_ms", str(heartbeat_ms),
                     "--join_timeout_ms", str(JOIN_TIMEOUT_MS)], run / "lighthouse.log", env)

        def replica(r: int, name: str) -> subprocess.Popen:
            return procs.start([py, str(JOB), "--replica", str(r), "--lighthouse", lighthouse,
                                "--data", str(data), "--steps", str(STEPS), "--step-delay",
                                str(STEP_DELAY), "--events", str(run / f"{name}.jsonl")],
                               run / f"{name}.log", env)

        group = [replica(r, f"replica{r}") for r in range(FULL)]
        victim = group[-1]
        wait_until(f"every replica at step {KILL_AT}", lambda: all(
            committed(read_events(run), p.pid) >= KILL_AT for p in group), procs=group)
        killed_at = time.time()
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait(timeout=10)
        survivors = group[:-1]
        again = wait_until("the survivors training again", lambda: min(
            committed([e for e in read_events(run) if e["t"] > killed_at], p.pid)
            for p in survivors), procs=survivors)
        wait_until(f"{REPLACE_AFTER} more steps", lambda: min(
            committed(read_events(run), p.pid) for p in survivors) >= again + REPLACE_AFTER,
            procs=survivors)
        spawned_at = time.time()
        new = replica(FULL - 1, "replacement")
        alive = [*survivors, new]
        wait_until("the end", lambda: all(p.poll() == 0 for p in alive), timeout=300,
                   procs=alive)
        events = read_events(run)
    finally:
        procs.stop()
    return (tf.recovery(events, victim_pid=victim.pid, killed_at=killed_at, full=FULL,
                        spawned_at=spawned_at, replacement_pid=new.pid),
            tf.overhead(events, full=FULL, until=killed_at))


def restart_trial(py: str, tmp: Path, data: Path) -> tuple[float | None, tf.Overhead | None]:
    """The full restart (module docstring, 2.): its "training again" and the plain loop's
    fault-free steps (the overhead's reference)."""
    run = tmp / "restart"
    run.mkdir()
    procs = Procs()

    def generation(name: str, steps: int) -> list[subprocess.Popen]:
        port = str(free_port())  # a new store and process group, as after a re-rendezvous
        return [procs.start([py, str(JOB), "--plain", "--data", str(data), "--steps",
                             str(steps), "--step-delay", str(STEP_DELAY), "--events",
                             str(run / f"{name}-{rank}.jsonl")], run / f"{name}-{rank}.log",
                            job_env({"RANK": str(rank), "LOCAL_RANK": str(rank),
                                     "WORLD_SIZE": str(FULL), "MASTER_ADDR": "127.0.0.1",
                                     "MASTER_PORT": port}))
                for rank in range(FULL)]

    try:
        first = generation("gen1", STEPS)
        wait_until(f"every worker at step {KILL_AT}", lambda: all(
            committed(read_events(run), p.pid) >= KILL_AT for p in first), procs=first)
        killed_at = time.time()
        os.killpg(first[-1].pid, signal.SIGKILL)
        for p in first[:-1]:  # torchrun's part: every other worker stopped, all restarted
            os.killpg(p.pid, signal.SIGTERM)
        for p in first:
            p.wait(timeout=30)
        second = generation("gen2", REPLACE_AFTER)
        wait_until("the restarted workers' first steps", lambda: tf.restart_again(
            read_events(run), killed_at=killed_at), procs=second)
        wait_until("the end", lambda: all(p.poll() == 0 for p in second), timeout=300,
                   procs=second)
        events = read_events(run)
    finally:
        procs.stop()
    return (tf.restart_again(events, killed_at=killed_at),
            tf.overhead([e for e in events if e["t"] < killed_at], full=FULL))


def load() -> str:
    """The load averages, printed beside each figure (the machine is shared)."""
    return "/".join(f"{x:.1f}" for x in os.getloadavg())
