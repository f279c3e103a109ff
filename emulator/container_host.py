"""What an emulated node needs to run containers as the Deep Learning AMI does.

The DLAMI runs a rank's image with the product's rootless ``podman run`` argv
(``bootstrap_scripts.containers.podman_argv``) on a host with cgroup v2 and the usual
``/dev/mqueue``. This machine differs, and the emulator makes up for it here, never in the
product's code (docs/emulator.md, "Container images"):

- **cgroups**: the host has a hybrid cgroup layout (v1 controllers and a v2 hierarchy),
  which crun refuses, and no ``CAP_SYS_RESOURCE`` to raise limits. A node's processes run in
  a mount namespace of their own with an empty tmpfs over ``/sys/fs/cgroup``
  (:func:`in_node_namespace`), and the node's podman is told ``cgroups = "disabled"`` and
  explicit ``nofile``/``nproc`` limits (:func:`containers_conf`): a container here has no
  cgroup limits at all, where on AWS it has the user's slice.
- **/dev/mqueue**: ``--ipc=host`` needs it; the namespace mounts one (the directory is
  created on the host's ``/dev`` if missing, an empty mount point).
- **the registry**: ``emulator.registry`` speaks plain HTTP on loopback; the node's podman
  is told that address is insecure (:func:`registries_conf`); ECR is HTTPS only.
- **one machine, many nodes**: each user's image store (under the node's root) and runtime
  directory (where podman's pause process keeps its pid; :func:`runtime_base`) are the
  node's own, so an image pulled on one emulated node is not on another, as on separate
  instances. The runtime directory has a short path of its own in the temporary directory:
  with a runtime directory path past about 40 characters (a node's root is longer), every
  ``podman run`` here waited 20 s for conmon's exit file ("Exceeded conmon timeout").

The node's ``podman`` is a wrapper first on the node's PATH (the directory of the stand-in
``nvidia-smi``, ``emulator.gpus``) that points podman at these files and execs the real one;
its ``skopeo`` (which resolves a tag at submit) is one too, given the node's registries
file by skopeo's own (hidden) ``--registries-conf``: Debian's skopeo 1.9 does not read
``CONTAINERS_REGISTRIES_CONF``.
"""

from __future__ import annotations

import hashlib
import shlex
import shutil
import tempfile
from pathlib import Path

REAL_PODMAN = "/usr/bin/podman"
REAL_SKOPEO = "/usr/bin/skopeo"
#: Relative to a node's root.
CONF_DIR = "emulator/containers"
STORE_DIR = "var/lib/containers-users"
#: The limits crun cannot leave as inherited without CAP_SYS_RESOURCE.
ULIMITS = ("nofile=1024:1024", "nproc=1000:1000")

_NAMESPACE_SCRIPT = ("mount -t tmpfs -o mode=755 dl-no-cgroups /sys/fs/cgroup"
                     " && mkdir -p /dev/mqueue && mount -t mqueue mqueue /dev/mqueue"
                     ' && exec "$@"')


def in_node_namespace(argv: list[str]) -> list[str]:
    """``argv`` run (by root) in a new mount namespace with the node's container quirks:
    mounts of the host still reach it (slave propagation), its own never leave it."""
    return ["unshare", "--mount", "--propagation", "slave", "--",
            "/bin/sh", "-c", _NAMESPACE_SCRIPT, "dl-node-namespace", *argv]


def containers_conf() -> str:
    ulimits = ", ".join(f'"{u}"' for u in ULIMITS)
    return f'[containers]\ncgroups = "disabled"\ndefault_ulimits = [{ulimits}]\n'


def registries_conf(insecure: list[str]) -> str:
    blocks = "".join(f'\n[[registry]]\nlocation = "{r}"\ninsecure = true\n' for r in insecure)
    return "unqualified-search-registries = []\n" + blocks


def storage_conf(root: Path) -> str:
    """Rootless stores under the node's root, one per user (``$UID``: podman expands it)."""
    return ('[storage]\ndriver = "overlay"\n'
            f'rootless_storage_path = "{root / STORE_DIR}/$UID"\n')


def runtime_base(root: Path) -> Path:
    """The node's parent of its users' ``XDG_RUNTIME_DIR``s: short (see the module's note)."""
    tag = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:8]
    return Path(tempfile.gettempdir()) / f"dl-podman-{tag}"


def remove_podman(root: Path) -> None:
    """Remove what :func:`install_podman` put outside the node's root (its users' podman
    processes must be stopped first)."""
    shutil.rmtree(runtime_base(root), ignore_errors=True)


def install_podman(root: Path, bin_dir: Path, insecure_registries: list[str]) -> Path:
    """Write the node's container settings under ``root`` and its ``podman`` wrapper in
    ``bin_dir`` (first on the node's PATH); returns the wrapper's path."""
    conf = root / CONF_DIR
    conf.mkdir(parents=True, exist_ok=True)
    (conf / "containers.conf").write_text(containers_conf())
    (conf / "registries.conf").write_text(registries_conf(insecure_registries))
    (conf / "storage.conf").write_text(storage_conf(root))
    for shared in (root / STORE_DIR, runtime_base(root)):
        shared.mkdir(parents=True, exist_ok=True)
        shared.chmod(0o1777)  # each user makes its own directory in it, as /run/user is
    runtime = shlex.quote(str(runtime_base(root)))
    bin_dir.mkdir(parents=True, exist_ok=True)
    wrapper = bin_dir / "podman"
    wrapper.write_text(
        "#!/bin/sh\n"
        "# emulator (emulator/container_host.py): this node's podman settings, then podman\n"
        f"export CONTAINERS_CONF={shlex.quote(str(conf / 'containers.conf'))}\n"
        f"export CONTAINERS_REGISTRIES_CONF={shlex.quote(str(conf / 'registries.conf'))}\n"
        f"export CONTAINERS_STORAGE_CONF={shlex.quote(str(conf / 'storage.conf'))}\n"
        f'XDG_RUNTIME_DIR={runtime}/$(id -u)\n'
        'mkdir -p -m 700 "$XDG_RUNTIME_DIR" && export XDG_RUNTIME_DIR\n'
        f'exec {REAL_PODMAN} "$@"\n')
    wrapper.chmod(0o755)
    skopeo = bin_dir / "skopeo"
    skopeo.write_text(  # skopeo 1.9 reads no CONTAINERS_REGISTRIES_CONF: its hidden flag
        "#!/bin/sh\n"
        "# emulator (emulator/container_host.py): this node's registries, then skopeo\n"
        f'exec {REAL_SKOPEO} --registries-conf {shlex.quote(str(conf / "registries.conf"))}'
        ' "$@"\n')
    skopeo.chmod(0o755)
    return wrapper
