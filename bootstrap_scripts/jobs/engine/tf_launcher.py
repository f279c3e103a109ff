"""The TensorFlow launcher: the same command on every node, each with its ``TF_CONFIG``.

Part of :mod:`bootstrap_scripts.jobs.engine.launchers` (registered in its planner table), apart only
to keep that module short enough to read in one sitting.
"""

from __future__ import annotations

import json

from bootstrap_scripts.jobs.engine.plan_types import (
    LaunchError,
    LaunchOptions,
    LaunchPlan,
    python_command,
)
from bootstrap_scripts.protocol.jobs import Proc, Share
from bootstrap_scripts.protocol.membership import Membership

# -- tensorflow ----------------------------------------------------------------------------


def tf_cluster(m: Membership, opts: LaunchOptions) -> dict[str, list[str]]:
    """The cluster part of TF_CONFIG. PS mode keeps the original's assignment: one PS per
    host at ``tf_port`` (2222) and one worker per GPU at ``tf_worker_base_port + g``."""
    if opts.tf_mode == "worker":
        return {"worker": [f"{n.address}:{opts.tf_port}" for n in m.nodes]}
    if opts.tf_mode == "ps":
        return {
            "ps": [f"{n.address}:{opts.tf_port}" for n in m.nodes],
            "worker": [f"{n.address}:{opts.tf_worker_base_port + g}"
                       for n in m.nodes for g in range(n.slots)],
        }
    raise LaunchError(f"--tf-mode must be 'worker' or 'ps', got {opts.tf_mode!r}")


def tf_config(cluster: dict[str, list[str]], task_type: str, index: int) -> str:
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}},
                      sort_keys=True, separators=(",", ":"))


def tf_plan(m: Membership, command: list[str], opts: LaunchOptions) -> LaunchPlan:
    cluster = tf_cluster(m, opts)
    argv = tuple(python_command(command, opts.python))
    shares = []
    worker_index = 0
    for node in m.nodes:
        if opts.tf_mode == "worker":
            procs = (Proc(argv=argv, env={"TF_CONFIG": tf_config(cluster, "worker", node.rank)}),)
        else:
            ps = Proc(argv=argv, label="ps", wait=False,
                      env={"TF_CONFIG": tf_config(cluster, "ps", node.rank)})
            workers = []
            for g in range(node.slots):
                env = {"TF_CONFIG": tf_config(cluster, "worker", worker_index)}
                if node.gpus:
                    env["CUDA_VISIBLE_DEVICES"] = str(g)
                workers.append(Proc(argv=argv, env=env, label=f"worker{g}"))
                worker_index += 1
            procs = (ps, *workers)
        shares.append(Share(node.rank, node.address, procs))
    return LaunchPlan(
        "tf", tuple(shares), False,
        files={"tf_cluster.json": json.dumps(cluster, indent=2, sort_keys=True) + "\n"},
        summary=f"TensorFlow {opts.tf_mode} mode on {len(m.nodes)} node(s)",
    )
