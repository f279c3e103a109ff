"""A real image, a real registry, real rootless podman: ``dl-container`` as a real user.

A ~3 MB image built from this machine's own files (``tests.support.images``) is pushed by
skopeo to the emulated ECR registry (``emulator.registry``: Debian's ``docker-registry``);
an emulated node's podman (``emulator.container_host``: its wrapper and the node's mount
namespace) then serves ``dl-container pull`` and ``dl-container run`` run by an
unprivileged user, exactly as the launcher would run them. What is checked is what the
product promises a rank: the caller's uid inside (not root), the job directory at the same
path and writable as the user, the image's own files, the command's output and exit status,
and a second pull that fetches nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from emulator import container_host
from emulator.nodes import PYTHON
from emulator.registry import Registry
from tests.support.images import build_layout, push, stop_processes_of
from tests.support.users import CAN_CREATE_USERS, job_user, login_env, reachable_python

__all__ = ["job_user", "reachable_python"]  # fixtures, used by name

TOOLS = ("podman", "skopeo", "docker-registry", "unshare", "setpriv")
pytestmark = [
    pytest.mark.skipif(not CAN_CREATE_USERS, reason="needs root (users, the node's namespace)"),
    pytest.mark.skipif(any(shutil.which(t) is None for t in TOOLS),
                       reason="scripts/system-deps.sh installs podman, skopeo, docker-registry"),
]


@pytest.fixture(scope="module")
def place() -> Iterator[Path]:
    """A directory every user can traverse (the node's root, the job's directory)."""
    path = Path(tempfile.mkdtemp(prefix="dl-image-test-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def image(place: Path) -> Iterator[str]:
    """The tiny image pushed to a running emulated registry: ``host:port/team/tiny@digest``."""
    with Registry(place / "registry") as registry:
        layout = place / "layout"
        digest = build_layout(layout)
        pushed = push(layout, f"{registry.endpoint}/team/tiny:v1")
        assert pushed == digest  # the registry keeps the manifest's bytes as built
        yield f"{registry.endpoint}/team/tiny@{digest}"


def dl_container(user, node_root: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """``dl-container ARGS`` as ``user`` on the emulated node: started by root in the node's
    mount namespace, dropped to the user before the product's code runs."""
    env = {**login_env(user),
           "PATH": f"{node_root / 'usr/bin'}:/usr/local/bin:/usr/bin:/bin",
           "DL_JOB_DIR": str(cwd)}
    as_user = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}",
               "--clear-groups", "--", PYTHON, "-m", "bootstrap_scripts.containers.run", *args]
    return subprocess.run(container_host.in_node_namespace(as_user), cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def test_a_user_runs_a_command_in_a_pinned_image_as_itself(
        image: str, place: Path, job_user, reachable_python) -> None:
    node = place / f"node-{job_user.pw_name}"
    registry = image.split("/", 1)[0]
    container_host.install_podman(node, node / "usr/bin", [registry])
    job = place / f"job-{job_user.pw_name}"
    job.mkdir()
    (job / "msg").write_text("from the job directory\n")
    os.chown(job, job_user.pw_uid, job_user.pw_gid)
    try:
        pulled = dl_container(job_user, node, job, "pull", image)
        assert pulled.returncode == 0, pulled.stderr
        assert f"{image} pulled" in pulled.stdout
        again = dl_container(job_user, node, job, "pull", image)
        assert again.returncode == 0, again.stderr
        assert f"{image} present" in again.stdout  # a second pull fetches nothing

        ran = dl_container(job_user, node, job, "run", image, "--", "sh", "-c",
                           "id -u; id -g; pwd; cat msg; echo written > out; "
                           "test -e /usr/bin/python3 || echo no-host-python; exit 7")
        assert ran.returncode == 7, ran.stderr  # the rank's status is the command's
        assert ran.stdout.splitlines() == [
            str(job_user.pw_uid), str(job_user.pw_gid), str(job),
            "from the job directory", "no-host-python"]
        # written inside, owned by the user outside: the same path, the same uid
        assert (job / "out").read_text() == "written\n"
        assert (job / "out").stat().st_uid == job_user.pw_uid
    finally:
        stop_processes_of(job_user.pw_uid)
        container_host.remove_podman(node)


def test_a_missing_image_fails_the_pull_naming_it(image: str, place: Path, job_user,
                                                 reachable_python) -> None:
    node = place / f"node-{job_user.pw_name}"
    container_host.install_podman(node, node / "usr/bin", [image.split("/", 1)[0]])
    missing = image.replace("team/tiny", "team/absent")
    try:
        done = dl_container(job_user, node, place, "pull", missing)
        assert done.returncode == 3, done.stdout + done.stderr
        assert f"pulling {missing} failed" in done.stderr
    finally:
        stop_processes_of(job_user.pw_uid)
        container_host.remove_podman(node)
