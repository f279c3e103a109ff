"""Drill job: every rank prints numbered lines, checkpointing after each, then one
completion line; a restarted attempt (``DL_RESUME=1``) continues after its checkpoint.

``--lines N`` (default 40) lines ``line rank=R n=K attempt=A``, one every ``--every`` seconds;
then ``COMPLETE rank=R job=<DL_JOB_ID>``. The checkpoint is
``<DL_CHECKPOINT_DIR>/rank<R>.json`` (``{"next": K}``), written atomically after each line.
"""

import argparse
import json
import os
import time

p = argparse.ArgumentParser()
p.add_argument("--lines", type=int, default=40)
p.add_argument("--every", type=float, default=0.2)
args = p.parse_args()
rank = os.environ.get("DEEPLEARNING_NODE_RANK", "0")
attempt = os.environ.get("DL_RESTART_COUNT", "0")
ckpt_dir = os.environ.get("DL_CHECKPOINT_DIR", "")
ckpt = os.path.join(ckpt_dir, f"rank{rank}.json") if ckpt_dir else ""
start = 0
if ckpt and os.environ.get("DL_RESUME") == "1":
    try:
        with open(ckpt) as fh:
            start = int(json.load(fh)["next"])
    except (OSError, ValueError, KeyError):
        start = 0
for k in range(start, args.lines):
    print(f"line rank={rank} n={k} attempt={attempt}", flush=True)
    if ckpt:
        os.makedirs(ckpt_dir, exist_ok=True)
        with open(ckpt + ".tmp", "w") as fh:
            json.dump({"next": k + 1}, fh)
        os.replace(ckpt + ".tmp", ckpt)
    time.sleep(args.every)
print(f"COMPLETE rank={rank} job={os.environ.get('DL_JOB_ID', '')}", flush=True)
