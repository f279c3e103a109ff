"""The example job (``train_digits``, its flags as given) with the hang drill's hook and a
straggler hook, for the goodput bench; the example's own code is not changed.

Each step is declared through ``train_progress.Tracker.step``; this wraps it, after the
declaration, for the rank ``GOODPUT_RANK``:

- while the file ``$GOODPUT_STRAGGLE`` exists, the rank sleeps ``GOODPUT_STRAGGLE_S`` more
  per step (a slow GPU or a noisy neighbour: every rank then waits for it in the all-reduce);
- once the file ``$GOODPUT_HANG`` exists (and no ``$GOODPUT_HANG.done``), the rank writes
  the ``.done`` file and sleeps forever in ``hang_here`` (as the hang drill's job does),
  its peers waiting in the next all-reduce; the ``.done`` file keeps a restarted attempt
  from hanging again.
"""

import os
import sys
import time

from bootstrap_scripts.examples import train_digits, train_progress

RANK = int(os.environ.get("GOODPUT_RANK", "-1"))
HANG = os.environ.get("GOODPUT_HANG", "")
STRAGGLE = os.environ.get("GOODPUT_STRAGGLE", "")
STRAGGLE_S = float(os.environ.get("GOODPUT_STRAGGLE_S", "0.3"))
declare = train_progress.Tracker.step


def hang_here() -> None:
    while True:
        time.sleep(3600)


def step(self, global_step: int, loss: float, samples: int) -> None:
    declare(self, global_step, loss, samples)
    if int(os.environ.get("RANK", "-2")) != RANK:
        return
    if STRAGGLE and os.path.exists(STRAGGLE):
        time.sleep(STRAGGLE_S)
    if HANG and os.path.exists(HANG) and not os.path.exists(HANG + ".done"):
        with open(HANG + ".done", "w") as f:
            f.write(f"{global_step} {time.time():.3f}\n")
        print(f"hanging rank={RANK} step={global_step}", flush=True)
        hang_here()


train_progress.Tracker.step = step
train_digits.exit_without_teardown(lambda: train_digits.main(sys.argv[1:]))
