"""A real image, a real registry, real rootless podman: ``dl-container`` as a real user.

A ~3 MB image built from this machine's own files (``tests.support.images``) is pushed by
skopeo to the emulated ECR registry (``emulator.registry``: Debian's ``docker-registry``);
an emulated node's podman (``emulator.container_host``: its wrapper and the node's mount
namespace) then serves ``dl-container pull`` and ``dl-container run`` run by an
unprivileged user, exactly as the launcher would run them. What is checked is what the
product promises a rank: the caller's uid inside (not root), the job directory at the same
path and writable as the user, the image's own files, the command's output and exit status,
and a second pull that fetches nothing.

The pull a job runs on every node before its ranks (``jobs/engine/image_pull.py``) is run
here as the executor starts it (its command and environment, as the user, outside the
node's namespace); the tag's resolution at submit as ``dl-run`` runs it, as the user,
through the node's skopeo.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootstrap_scripts.containers import causes
from bootstrap_scripts.jobs.engine.image_pull import pull_request
from bootstrap_scripts.protocol.run_request import RunRequest
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
        assert done.returncode == causes.EXIT_OF[causes.NOT_FOUND], done.stdout + done.stderr
        assert f"error: dl-container pull {missing}: not found: Error: " in done.stderr
    finally:
        stop_processes_of(job_user.pw_uid)
        container_host.remove_podman(node)


def as_executor_would(user, node_root: Path, argv: tuple[str, ...], env: dict[str, str]
                      ) -> subprocess.CompletedProcess:
    """A share's process as the executor starts it: the node's environment (its PATH first),
    the share's variables on top, the job's user, in ``/``."""
    full = {**login_env(user), "PATH": f"{node_root / 'usr/bin'}:/usr/local/bin:/usr/bin:/bin",
            **env}
    as_user = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}",
               "--clear-groups", "--", *argv]
    return subprocess.run(as_user, cwd="/", env=full, capture_output=True, text=True,
                          timeout=120, check=False)


def test_a_tag_resolves_to_the_pushed_digest_and_a_wrong_tag_is_refused_naming_it(
        image: str, place: Path, job_user, reachable_python) -> None:
    node = place / f"node-{job_user.pw_name}"
    container_host.install_podman(node, node / "usr/bin", [image.split("/", 1)[0]])
    repository, digest = image.split("@")
    try:
        done = dl_container(job_user, node, place, "resolve", f"{repository}:v1")
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"{repository}:v1@{digest}"  # what was pushed
        wrong = dl_container(job_user, node, place, "resolve", f"{repository}:v9")
        assert wrong.returncode == causes.EXIT_OF[causes.NOT_FOUND], wrong.stderr
        assert f"tag 'v9' not found in {repository}" in wrong.stderr
    finally:
        stop_processes_of(job_user.pw_uid)
        container_host.remove_podman(node)


def test_the_jobs_pull_step_pulls_once_per_digest_with_progress_and_names_the_cause(
        place: Path, job_user, reachable_python) -> None:
    """Its own registry, stopped half-way: the second job's pull of the same digest must
    succeed without it (nothing fetched), and a pull that needs it then fails "registry
    unreachable"."""
    node = place / f"node-pull-{job_user.pw_name}"
    own = Registry(place / f"registry-{job_user.pw_name}").start()
    try:
        layout = place / "layout-pull"
        build_layout(layout)
        digest = push(layout, f"{own.endpoint}/team/tiny:v1")
        pinned = f"{own.endpoint}/team/tiny:v1@{digest}"
        container_host.install_podman(node, node / "usr/bin", [own.endpoint])
        step = pull_request(RunRequest(job_id="train-1", command=("python", "t.py"),
                                       image=pinned))
        first = as_executor_would(job_user, node, step.command, step.env)
        assert first.returncode == 0, first.stdout + first.stderr
        lines = first.stdout.splitlines()
        assert lines[0] == f"dl-container: pulling {own.endpoint}/team/tiny@{digest}"
        assert "dl-container: layer 1: sha256:" in first.stdout
        assert re.fullmatch(rf"dl-container: {re.escape(own.endpoint)}/team/tiny@{digest} "
                            r"pulled in \d+\.\d s \(1 layer\(s\), \d+\.\d [MkG]B\)",
                            lines[-1]), lines[-1]

        own.stop()  # nothing can be fetched from now on
        second = as_executor_would(job_user, node, step.command, step.env)
        assert second.returncode == 0, second.stdout + second.stderr
        assert "present, nothing pulled (1 layer(s)" in second.stdout

        other = pinned.replace(digest, "sha256:" + "e" * 64)  # not in the store
        down = as_executor_would(job_user, node, pull_request(RunRequest(
            job_id="train-2", command=("t",), image=other)).command, step.env)
        assert down.returncode == causes.EXIT_OF[causes.UNREACHABLE], down.stderr
        assert ": registry unreachable: Error: " in down.stderr
    finally:
        own.stop()
        stop_processes_of(job_user.pw_uid)
        container_host.remove_podman(node)
