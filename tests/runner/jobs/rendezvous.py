"""Benchmark job: report the wall-clock time once the process group is initialised."""

import os
import time

import torch.distributed as dist

dist.init_process_group("gloo")
dist.barrier()
print(f"rendezvous-ok rank={dist.get_rank()} world_size={dist.get_world_size()} "
      f"t={time.time():.3f} pid={os.getpid()}", flush=True)
dist.destroy_process_group()
