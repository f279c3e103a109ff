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

import os
import subprocess
import sys

import pytest

from tests.chaos import torchft_figures as tf
from tests.chaos.torchft_trials import (
    FULL,
    HEARTBEAT_TIMEOUTS_MS,
    JOIN_TIMEOUT_MS,
    KILL_AT,
    REPLACE_AFTER,
    STEP_DELAY,
    TRIALS,
    VENV,
    load,
    restart_trial,
    torchft_python,
    torchft_trial,
    write_data,
)


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
