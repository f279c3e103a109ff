"""Test job: every rank reports, the ranks on node ``--fail-node`` exit with ``--code``."""

import argparse
import os
import sys

p = argparse.ArgumentParser()
p.add_argument("--fail-node", type=int, required=True)
p.add_argument("--code", type=int, default=1)
a = p.parse_args()
node = int(os.environ["DEEPLEARNING_NODE_RANK"])
print(f"node={node} rank={os.environ.get('RANK', '-')} pid={os.getpid()}", flush=True)
sys.exit(a.code if node == a.fail_node else 0)
