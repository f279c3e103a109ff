"""Test job: every rank says which user it runs as and leaves a file of its own on EFS."""

import os
import pwd
from pathlib import Path

node = int(os.environ["DEEPLEARNING_NODE_RANK"])
user = pwd.getpwuid(os.getuid()).pw_name  # checkpoints/<user>/: the executors made it ours
out = Path(os.environ["EFS_MOUNT"]) / "checkpoints" / user / os.environ["DL_JOB_ID"]
out.mkdir(parents=True, exist_ok=True)
(out / f"node{node}.txt").write_text(f"{os.getuid()}\n")
print(f"whoami node={node} uid={os.getuid()} euid={os.geteuid()} gid={os.getgid()} "
      f"groups={sorted(os.getgroups())}", flush=True)
