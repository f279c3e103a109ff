"""GPUs for emulated nodes: a stand-in ``nvidia-smi`` (the only way the product counts GPUs).

The node agent counts GPUs with ``nvidia-smi -L`` (``bootstrap_scripts.agent.gpus``): a
missing or failing driver means 0. An emulated node with ``gpus=N`` gets this script first
on its ``PATH``; ``fault=True`` makes it fail as a broken driver does (exit 9, message on
stderr), to exercise that path. No GPU is ever used: jobs on emulated nodes run on CPU.
"""

from __future__ import annotations

import stat
from pathlib import Path

#: Where a node's stand-in driver lives, relative to its root (first on its PATH).
NODE_BIN_DIR = "usr/bin"


def fake_nvidia_smi(directory: Path, gpus: int, *, fault: bool = False) -> Path:
    """Write ``directory/nvidia-smi`` listing ``gpus`` GPUs (or failing); returns
    ``directory``, to prepend to ``PATH``."""
    if gpus < 0:
        raise ValueError(f"gpus must be >= 0, got {gpus}")
    directory.mkdir(parents=True, exist_ok=True)
    if fault:
        body = "echo 'NVIDIA-SMI has failed because it could not communicate with the " \
               "NVIDIA driver.' >&2\nexit 9\n"
    else:
        lines = "".join(f"GPU {g}: Tesla V100-SXM2-16GB (UUID: GPU-{g:08d}-emulated)\\n"
                        for g in range(gpus))
        body = f"[ \"$1\" = -L ] || exit 9\nprintf '{lines}'\n"
    script = directory / "nvidia-smi"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return directory
