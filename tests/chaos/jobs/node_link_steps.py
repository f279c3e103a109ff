"""Drill job (torchrun, CPU, gloo): one all-reduce per step, each step declared
(``bootstrap_scripts.progress``), ``--steps`` steps then ``COMPLETE rank=R``; a restarted
attempt (``DL_RESUME=1``) starts after its checkpoint (``<DL_CHECKPOINT_DIR>/rank<R>.json``).

Its gloo connections are on the node's own address (``DEEPLEARNING_NODE_ADDR``), as on an
instance whose host name resolves to its private address: every emulated node's host name
is the host's (127.0.0.1), where a partition between two nodes' addresses could not be made.
"""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist

from bootstrap_scripts import progress
from bootstrap_scripts.examples import train_progress

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=100)
p.add_argument("--every", type=float, default=0.5)
args = p.parse_args()
store, rank, world = next(dist.rendezvous("env://"))
opts = dist.ProcessGroupGloo._Options()
opts._devices = [dist.ProcessGroupGloo.create_device(
    hostname=os.environ["DEEPLEARNING_NODE_ADDR"])]
timeout = train_progress.collective_timeout()
if timeout is not None:
    opts._timeout = timeout
pg = dist.ProcessGroupGloo(store, rank, world, opts)
ckpt_dir = os.environ.get("DL_CHECKPOINT_DIR", "")
ckpt = os.path.join(ckpt_dir, f"rank{rank}.json") if ckpt_dir else ""
start = 0
if ckpt and os.environ.get("DL_RESUME") == "1":
    try:
        with open(ckpt) as fh:
            start = int(json.load(fh)["next"])
    except (OSError, ValueError, KeyError):
        start = 0
print(f"rank={rank} addr={os.environ.get('DEEPLEARNING_NODE_ADDR', '')} start={start}",
      flush=True)
for step in range(start + 1, args.steps + 1):
    t = torch.ones(4)
    pg.allreduce([t]).wait()
    progress.report(step, loss=1.0 / step)
    if ckpt:
        os.makedirs(ckpt_dir, exist_ok=True)
        with open(ckpt + ".tmp", "w") as fh:
            json.dump({"next": step}, fh)
        os.replace(ckpt + ".tmp", ckpt)
    time.sleep(args.every)
print(f"COMPLETE rank={rank}", flush=True)
