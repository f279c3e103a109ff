"""A shell on an emulated node in which the README's commands work as written.

On a real master ``dl-run``, ``dl-jobs``, ``dl-health`` and ``dl-scale`` are on PATH and the
node's root is ``/``. An emulated node's root is a directory, so its installed wrappers need
``--root`` (an option every one of these commands already takes). For a cluster ``--keep`` left
running, this module writes next to the demo's state:

- ``<name>-bin/``: one wrapper per command that runs the node's own installed wrapper with
  ``--root <node root>`` and the arguments as given;
- ``<name>-env.sh``: to source in a POSIX shell: the emulator's AWS settings (moto only, dummy
  credentials), the node's metadata endpoint, the node's ``DEEPLEARNING_*`` environment
  (read when sourced, as ``/etc/profile.d`` would be on a node) and those wrappers first on
  PATH;
- ``<name>-shell``: an executable that sources the env file, then runs the command given as
  arguments, or an interactive ``$SHELL``.

With ``scheduler=slurm`` the env file also sets ``SLURM_CONF`` to the node's own slurm.conf
(Slurm's default, ``/etc/slurm/slurm.conf``, on an instance), so ``sbatch``, ``srun``,
``squeue`` and ``scancel`` work as written, and ``emulator.slurm_node.user_env`` (the bind
preload every task of a job inherits from its submitter).

The product's commands are not changed and know nothing of the emulator.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from bootstrap_scripts.agent.install import WRAPPERS
from bootstrap_scripts.protocol.paths import NodePaths, SlurmPaths
from emulator import deploy as dp
from emulator import slurm_node
from emulator.demo.context import BIN_DIR
from emulator.node_network import bind_preload
from emulator.nodes import PYTHON

#: Every command the installer puts on a node's PATH for people (each takes ``--root``); the
#: agent is a daemon systemd runs, not a command.
COMMANDS = tuple(sorted(name for name in WRAPPERS if name != "dl-agent"))


def wrapper(target: Path, root: Path) -> str:
    return (f"#!/bin/sh\n# The emulated node's {target.name}, aimed at its root (on a real "
            f"node the root is /).\nexec {shlex.quote(str(target))} --root "
            f"{shlex.quote(str(root))} \"$@\"\n")


def env_script(root: Path, bin_dir: Path, env: dict[str, str]) -> str:
    lines = ["# Source me: the environment of the emulated node at " + str(root) + ".",
             *(f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items())),
             f"if [ -r {shlex.quote(str(NodePaths(root).env))} ]; then",
             f"  set -a; . {shlex.quote(str(NodePaths(root).env))}; set +a",
             "fi",
             f"PATH={shlex.quote(str(bin_dir))}:{shlex.quote(str(Path(PYTHON).parent))}:\"$PATH\"",
             "export PATH"]
    return "\n".join(lines) + "\n"


def shell_script(env_file: Path, name: str, address: str) -> str:
    return (f"#!/bin/sh\n# A shell (or, with arguments, one command) on the emulated {name}.\n"
            f". {shlex.quote(str(env_file))}\n"
            "if [ $# -gt 0 ]; then exec \"$@\"; fi\n"
            f"echo \"emulated {name} ({address}): {', '.join(COMMANDS)} work as on the node; "
            "exit to leave\"\n"
            "exec \"${SHELL:-/bin/sh}\" -i\n")


def write_node_shell(work: Path, name: str, root: Path, address: str,
                     env: dict[str, str]) -> tuple[Path, Path]:
    """Write the wrappers, ``<name>-env.sh`` and ``<name>-shell`` under ``work``; returns
    (shell, env file). ``env``: the AWS settings and metadata endpoint the node's processes
    see."""
    bin_dir = work / f"{name}-bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for cmd in COMMANDS:
        target = root / BIN_DIR / cmd
        if target.exists():
            path = bin_dir / cmd
            path.write_text(wrapper(target, root))
            path.chmod(0o755)
    env_file = work / f"{name}-env.sh"
    slurm_conf = SlurmPaths(root).slurm_conf
    if slurm_conf.exists():
        env = {**env, "SLURM_CONF": str(slurm_conf),
               **slurm_node.user_env(bind_preload(work / "lib"))}
    env_file.write_text(env_script(root, bin_dir, {**env, "PYTHONPATH": str(dp.REPO_ROOT)}))
    shell = work / f"{name}-shell"
    shell.write_text(shell_script(env_file, name, address))
    shell.chmod(0o755)
    return shell, env_file
