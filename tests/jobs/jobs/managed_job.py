"""Test job for managed runs: each rank says what the controller gave it, then does as told.

``--sleep S``: run S seconds (ticking) before exiting; ``--sleep-first S``: only on the
first attempt (DL_RESTART_COUNT 0); ``--fail-attempts N``: exit 3 while DL_RESTART_COUNT < N.
"""

import argparse
import os
import time

p = argparse.ArgumentParser()
p.add_argument("--sleep", type=float, default=0.0)
p.add_argument("--sleep-first", type=float, default=0.0)
p.add_argument("--fail-attempts", type=int, default=0)
p.add_argument("--tag", default="")
args = p.parse_args()
restart = int(os.environ.get("DL_RESTART_COUNT", "-1"))
print(f"managed rank={os.environ.get('DEEPLEARNING_NODE_RANK')} tag={args.tag} "
      f"job={os.environ.get('DL_JOB_ID')} restart={restart} "
      f"resume={os.environ.get('DL_RESUME', '-')} ckpt={os.environ.get('DL_CHECKPOINT_DIR')} "
      f"uid={os.getuid()} t={time.time():.3f}", flush=True)
seconds = args.sleep + (args.sleep_first if restart == 0 else 0.0)
deadline = time.monotonic() + seconds
while time.monotonic() < deadline:
    time.sleep(0.2)
print(f"done rank={os.environ.get('DEEPLEARNING_NODE_RANK')} tag={args.tag} "
      f"t={time.time():.3f}", flush=True)
raise SystemExit(3 if restart < args.fail_attempts else 0)
