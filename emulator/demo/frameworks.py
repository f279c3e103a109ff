"""``--framework tf``: the demo's job in TensorFlow instead of PyTorch.

What changes is only the job: ``dl-run --launcher tf`` (one MultiWorkerMirroredStrategy
worker per node, each with the ``TF_CONFIG`` the launcher writes) runs
``bootstrap_scripts.examples.train_digits_tf``, which prints the PyTorch example's epoch and
final lines, so the demo follows it the same way. TensorFlow itself comes first:
``scripts/tf-deps.sh`` (``make tf-deps``) installs ``tensorflow-cpu`` into the interpreter
the demo and its nodes run with, without changing any installed package; it is opt-in
because it is large (about 1.3 GB).

The emulated nodes' own wildcard binds (TensorFlow's gRPC server binds ``0.0.0.0:<port>``)
are the emulated node's (``emulator/node_network.py``), for every job, not this option's.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

from emulator import deploy as dp
from emulator.demo.context import DemoContext, DemoError

TF_DEPS = dp.REPO_ROOT / "scripts" / "tf-deps.sh"
TF_EXAMPLE = "bootstrap_scripts.examples.train_digits_tf"


def ensure_tensorflow(ctx: DemoContext) -> None:
    """Install TensorFlow when missing; pip's own progress goes to the terminal."""
    if importlib.util.find_spec("tensorflow") is not None:  # no import: it takes seconds
        ctx.ok("tensorflow is installed")
        return
    ctx.step(f"installing TensorFlow for --framework tf: {TF_DEPS.relative_to(dp.REPO_ROOT)} "
             f"(once; about 270 MB to download)")
    res = subprocess.run(["bash", str(TF_DEPS), sys.executable], cwd=dp.REPO_ROOT,
                         stdin=subprocess.DEVNULL)
    if res.returncode != 0:
        raise DemoError(f"installing TensorFlow failed ({TF_DEPS.name} exited "
                        f"{res.returncode}; its output is above)")


def tf_job_args(port: int) -> list[str]:
    """The ``dl-run`` options of the TF job: the launcher and its port, as on AWS (the
    emulated nodes bind the wildcard as separate instances do by themselves)."""
    return ["--launcher", "tf", "--tf-port", str(port)]
