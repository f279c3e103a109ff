"""Test job: every rank reports it is ready, then sleeps (and keeps a child) until killed."""

import os
import subprocess
import sys
import time

child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(f"ready node={os.environ['DEEPLEARNING_NODE_RANK']} rank={os.environ.get('RANK', '-')} "
      f"pid={os.getpid()} child={child.pid}", flush=True)
time.sleep(600)
