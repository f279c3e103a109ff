"""Drill job (torchrun, CPU, gloo): every step one all-reduce, then the step is declared
(``bootstrap_scripts.progress``); in the first attempt rank ``--hang-rank`` stops making
progress at step ``--hang-at`` (it sleeps in ``hang_here`` forever, its peers wait in the
all-reduce of the next step). A restarted attempt (``DL_RESTART_COUNT`` > 0) runs to the end
and prints ``COMPLETE rank=R``.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist

from bootstrap_scripts import progress
from bootstrap_scripts.examples import train_progress


def hang_here() -> None:
    while True:
        time.sleep(3600)


p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=30)
p.add_argument("--hang-at", type=int, default=10)
p.add_argument("--hang-rank", type=int, default=1)
p.add_argument("--every", type=float, default=0.1)
args = p.parse_args()
dist.init_process_group("gloo", timeout=train_progress.collective_timeout())
rank = dist.get_rank()
attempt = int(os.environ.get("DL_RESTART_COUNT", "0") or 0)
print(f"rank={rank} addr={os.environ.get('DEEPLEARNING_NODE_ADDR', '')} attempt={attempt} "
      f"collective_timeout={train_progress.collective_timeout()}", flush=True)
for step in range(1, args.steps + 1):
    t = torch.ones(4)
    dist.all_reduce(t)
    progress.report(step, loss=1.0 / step)
    if attempt == 0 and rank == args.hang_rank and step == args.hang_at:
        print(f"hanging rank={rank} addr={os.environ.get('DEEPLEARNING_NODE_ADDR', '')} "
              f"step={step} at={time.time():.3f}", flush=True)
        hang_here()
    time.sleep(args.every)
print(f"COMPLETE rank={rank}", flush=True)
dist.destroy_process_group()
