"""An emulated node's own network stack, for the servers that bind the wildcard address.

On AWS every instance has its own network stack, so the same port is free on every node: a
server on ``0.0.0.0:2222`` on one node and another on ``0.0.0.0:2222`` on the next never
meet. The emulated nodes are processes of one host, each on its own 127.20.x.y address;
servers that bind their node's address (torchrun, the executors, IMDS) coexist, but a
wildcard bind on one node takes the port on all of them. TensorFlow's gRPC server always
binds ``0.0.0.0:<port>`` (it has no bind-address setting), so the TF_CONFIG that ``dl-run
--launcher tf`` writes (one worker per node, all on port 2222: right on AWS) fails on the
second node with "Could not start gRPC server".

``node_bind.c``, preloaded into a job's processes, gives each node that part of its own
stack back: a wildcard bind becomes a bind to the node's address (``DEEPLEARNING_NODE_ADDR``,
which the executor sets for every rank), what the wildcard reaches on an instance with that
one private address. It belongs to the emulated node, not to a way of starting a job: every
emulated node's job executor runs with it preloaded (:func:`executor_env`, used by
``emulator/nodes.py``), so every process it starts for a job (``dl-run``, ``dlc submit``, the
demo) inherits it. The executor itself has no ``DEEPLEARNING_NODE_ADDR``, so its own binds go
through unchanged; the job, its TF_CONFIG, the launcher and the product never know.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

SOURCE = Path(__file__).with_name("node_bind.c")
LIBRARY_NAME = "libdl-node-bind.so"


class NodeNetworkError(RuntimeError):
    """The preload could not be built; the message says what is missing."""


def bind_preload(out_dir: Path) -> Path:
    """``node_bind.c`` compiled into ``out_dir`` (once; again when the source is newer)."""
    lib = out_dir / LIBRARY_NAME
    if lib.exists() and lib.stat().st_mtime >= SOURCE.stat().st_mtime:
        return lib
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise NodeNetworkError(f"no C compiler (cc) to build {SOURCE.name}, which gives each "
                               f"emulated node its own wildcard binds: install gcc "
                               f"(scripts/system-deps.sh does)")
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = lib.with_name(f".{LIBRARY_NAME}.{os.getpid()}")
    res = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(tmp), str(SOURCE), "-ldl"],
                         capture_output=True, text=True, timeout=120)
    if res.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise NodeNetworkError(f"{cc} could not build {SOURCE.name} (exit {res.returncode}): "
                               f"{(res.stderr or res.stdout).strip()[-800:]}")
    os.replace(tmp, lib)
    return lib


def dl_run_args(lib: Path) -> list[str]:
    """The ``dl-run`` options that run a job's ranks with the preload (a job on nodes that
    are not the emulator's, e.g. a test's executors without ``executor_env``)."""
    return ["--env", f"LD_PRELOAD={lib}"]


def executor_env(lib_dir: Path) -> tuple[dict[str, str], str]:
    """(the environment an emulated node's executor adds: ``LD_PRELOAD`` of the library
    built in ``lib_dir``, a directory of the emulator's own (root's, never one another user
    could write: root's executor loads it), "") or ({}, why not) when it cannot be built:
    the node then binds as one host does, and only jobs that bind the wildcard on several
    nodes at once (TensorFlow) notice."""
    try:
        lib = bind_preload(lib_dir)
    except NodeNetworkError as exc:
        return {}, str(exc)
    return {"LD_PRELOAD": str(lib)}, ""
