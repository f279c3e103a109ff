"""torchft's recovery in place, measured with real processes next to a full restart of
torch's workers (``make bench``; needs ``make torchft-setup``, its own venv).

The goodput bench (``test_goodput.py``) shows that every fault costs a restart of every
training process (13-14 s on this 2-core machine: process start, torch's import, the
rendezvous). torchft (per-step fault tolerance) would keep the survivors' processes: this
bench measures what it costs instead, on the example's model and data
(``jobs/torchft_replica.py``), CPU and Gloo, every process real:

1. **in place** (torchft 0.2.0, its Rust Lighthouse as a process, :data:`FULL` replica
   groups of one process each, ``min_replicas`` 2): at step :data:`KILL_AT` one replica
   group is SIGKILLed; the survivors go on (figures: training again, discarded attempts,
   steps lost); :data:`REPLACE_AFTER` committed steps later the harness starts the
   replacement process, which joins the quorum and receives the weights from a live peer
   (figures: rejoined, its start and import, weights recovered). :data:`TRIALS` trials.
2. **restart** (the same loop without torchft: torch's gloo and DDP, :data:`FULL` worker
   processes): at the same step one worker is SIGKILLed and, as torchrun does on a worker's
   failure, every other worker is stopped (SIGTERM) and all :data:`FULL` are started again
   (new processes, torch imported again, a new store and process group): the fault -> the
   new workers' first step. The harness plays torchrun's part at once (no monitor interval,
   no rendezvous): this is the floor of torch's part of the goodput bench's per-fault
   figure (which also has the multi-node rendezvous: the dead agent's keep-alive, the last
   call, the checkpoint's load), measured on the same machine in the same run. (A real
   single-host ``torchrun --max-restarts 1`` was tried first: with torch 2.13 its restarted
   workers failed Gloo's ``connectFullMesh``, connection refused, so the harness restarts
   them itself.)
3. **overhead**: the loop's step time with and without torchft's Manager when nothing
   fails (the medians of the fault-free full-size steps of 1 and 2).

Printed, never asserted (timed figures are not test results); the test fails only when a
run does not complete (a survivor never trained again, a process exited non-zero). Every
process started here is stopped by process group at the end, even on failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

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


@pytest.mark.bench
def test_bench_torchft_recovery_in_place_vs_a_full_restart(tmp_path):
    py = torchft_python()
    if not py:
        print(f"\ntorchft not installed ({VENV}): make torchft-setup")
        return
    version = subprocess.run([py, "-c", "import importlib.metadata as m; print("
                              "m.version('torchft'), m.version('torch'))"],
                             capture_output=True, text=True, check=True).stdout.split()
    data = tmp_path / "digits.pt"
    write_data(data)
    lines = [f"\ntorchft {version[0]} (torch {version[1]}, CPU, Gloo), real processes on this "
             f"machine ({os.cpu_count()} cores): {FULL} replica groups of one process, "
             f"the example's MLP and data, step delay {STEP_DELAY} s, one group SIGKILLed at "
             f"step {KILL_AT}, its replacement started {REPLACE_AFTER} steps after the "
             f"survivors train again; Lighthouse min_replicas 2, join_timeout_ms "
             f"{JOIN_TIMEOUT_MS}, heartbeat_timeout_ms as said", tf.LEGEND]
    figures: dict[int, list[tf.Recovery]] = {}
    overheads = []
    for hb in HEARTBEAT_TIMEOUTS_MS:
        for n in range(1, TRIALS + 1):
            before = load()
            r, o = torchft_trial(py, tmp_path, data, f"torchft-{hb}-{n}", hb)
            figures.setdefault(hb, []).append(r)
            overheads.append(o)
            lines.append(
                f"  in place, heartbeat_timeout_ms {hb}, #{n}: training again "
                f"{_s(r.again_s)} after the SIGKILL ({r.discarded} attempt(s) discarded, "
                f"{r.lost_steps} step(s) lost); replacement rejoined at full size "
                f"{_s(r.rejoined_s)} after its start (interpreter {_s(r.start_s)}, import + "
                f"Manager {_s(r.import_s)}, healed from a peer: {r.healed}, weights equal "
                f"to the survivors': {r.weights_recovered}; the survivors' longest step "
                f"meanwhile {_ms(r.join_step_s)}); load before {before}, after "
                f"{load()}")
    before = load()
    restart_s, plain = restart_trial(py, tmp_path, data)
    lines.append(f"  full restart (no torchft; every worker stopped and started again, new "
                 f"processes, torch's import, a new process group; the harness does torchrun's "
                 f"part at once, no rendezvous): training again {_s(restart_s)} after the "
                 f"SIGKILL; load before {before}, after {load()}")
    for hb, runs in figures.items():
        lines.append(f"  median of {len(runs)}, heartbeat_timeout_ms {hb}: in place, training "
                     f"again {_s(tf.median([f.again_s for f in runs]))}, replacement rejoined "
                     f"{_s(tf.median([f.rejoined_s for f in runs]))} (the survivors never "
                     f"stopped); full restart: training again {_s(restart_s)}")
    known = [o for o in overheads if o is not None]
    if known and plain is not None:
        q = tf.median([o.quorum_s for o in known])
        c = tf.median([o.commit_s for o in known])
        s = tf.median([o.step_s for o in known])
        lines.append(f"  per step without a fault (medians, step delay excluded): torchft "
                     f"{1000 * s:.1f} ms (quorum {1000 * q:.1f} ms, should_commit "
                     f"{1000 * c:.1f} ms) vs torch's DDP {1000 * plain.step_s:.1f} ms: "
                     f"+{1000 * (s - plain.step_s):.1f} ms a step")
    print("\n".join(lines))
    assert all(f.again_s is not None for runs in figures.values() for f in runs), figures


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f} s"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{1000 * v:.0f} ms"


if __name__ == "__main__":  # pragma: no cover - a manual run: python -m tests.chaos...
    sys.exit(pytest.main([__file__, "-m", "bench", "-s"]))
