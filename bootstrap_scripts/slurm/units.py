"""The Slurm units the installer writes with ``--scheduler slurm``.

- ``dl-munged.service`` (every node): munged on the cluster's key;
- ``dl-slurmctld.service`` (the master): the controller, its state on EFS;
- ``dl-slurmd.service`` (every node that trains, the master too): a dynamic node under the
  node's explicit name, with its features and GPUs as the installer found them.

Each runs :mod:`.daemons`, which waits for the files the agent writes (the key at boot,
slurm.conf with the first membership) and then becomes the daemon; ``Restart=always``
covers a wait that ran out. slurmd's ``KillMode=process``: restarting it leaves running
steps' slurmstepd alone, as Slurm's own unit does.
"""

from __future__ import annotations

from collections.abc import Callable

from bootstrap_scripts.slurm import config, names

MUNGED_UNIT, SLURMCTLD_UNIT, SLURMD_UNIT = ("dl-munged.service", "dl-slurmctld.service",
                                            "dl-slurmd.service")
MODULE = "bootstrap_scripts.slurm.daemons"


def render_units(python_unit: Callable[..., str], *, python: str, package_dir: str,
                 root: str, efs: str, role: str, address: str, instance_type: str,
                 gpus: int, log_dir: str) -> dict[str, str]:
    """Unit name -> text. ``python_unit``: the installer's unit renderer
    (``agent.install.python_unit``), so these read like its other units."""
    common = ["--root", root, "--efs", efs]

    def unit(name: str, description: str, args: list[str], after: str,
             extra: tuple[str, ...] = ()) -> str:
        return python_unit(
            description=description, python=python, package_dir=package_dir, module=MODULE,
            args=args, root=root, log_file=f"{log_dir}/{name.removesuffix('.service')}.log",
            unit=(f"Wants={after}", f"After={after} remote-fs.target"),
            service=("Restart=always", "RestartSec=5", *extra))

    units = {MUNGED_UNIT: unit(MUNGED_UNIT, "munge: the cluster's Slurm authentication",
                               ["munged", *common], "dl-agent.service")}
    if role == "master":
        units[SLURMCTLD_UNIT] = unit(SLURMCTLD_UNIT, "Slurm controller (its state on EFS)",
                                     ["slurmctld", *common], MUNGED_UNIT)
    units[SLURMD_UNIT] = unit(
        SLURMD_UNIT, "Slurm node daemon (a dynamic node)",
        ["slurmd", *common, "--name", names.node_name(address), "--node-conf",
         config.slurmd_node_conf(role, instance_type, gpus)],
        MUNGED_UNIT, ("KillMode=process",))
    return units
