"""A user's job that dies by SIGKILL, sent by its own process (what any user can do)."""

import os
import signal

print(f"kill_self rank={os.environ.get('DEEPLEARNING_NODE_RANK')} uid={os.getuid()} "
      f"restart={os.environ.get('DL_RESTART_COUNT')}", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
