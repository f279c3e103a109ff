"""Drill (``make chaos``): an image job's pull through real executors, as a real user.

Two executor-only emulated nodes (``tests.support.cluster``; their executors root, as on a
cluster) each with the emulated node's podman and skopeo first on its PATH
(``emulator.container_host``), the emulated ECR registry with the tiny image, the master's
``allowedImages`` naming it. A user's ``dl-run --image REPOSITORY:TAG``:

- a wrong tag is refused at submit, naming it, and nothing is published;
- a digest the registry does not have fails the job before any rank, as its ``input``
  (every node was told "not found": a retry would be too), naming both nodes, and the job
  itself is never published;
- the right tag is resolved and pulled on both nodes, each node's progress in ``dl-run``'s
  output; a second job with it pulls nothing on either node.

What it does not show: the ranks inside the image. The emulated nodes' executors do not
run in the node's mount namespace yet (docs/containers.md), so ``podman run`` fails here
after the pull; only the lines up to the job's own start are checked.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from bootstrap_scripts.containers import allow
from emulator import container_host
from emulator.gpus import NODE_BIN_DIR
from emulator.registry import Registry
from tests.support import users
from tests.support.cluster import LocalCluster, free_rdzv_port
from tests.support.images import build_layout, push, stop_processes_of

job_user = users.job_user
reachable_python = users.reachable_python

TOOLS = ("podman", "skopeo", "docker-registry")
pytestmark = [
    pytest.mark.chaos,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (users, root executors)"),
    pytest.mark.skipif(any(shutil.which(t) is None for t in TOOLS),
                       reason="scripts/system-deps.sh installs podman, skopeo, docker-registry"),
]


@pytest.fixture()
def cluster(job_user, reachable_python) -> Iterator[tuple[LocalCluster, str, str]]:
    """The cluster, the image's repository (``host:port/team/tiny``) and its digest."""
    with users.cluster_for_users("dl-pull-", 2) as c:
        registry = Registry(c.tmp / "registry").start()
        try:
            layout = c.tmp / "layout"
            digest = build_layout(layout)
            push(layout, f"{registry.endpoint}/team/tiny:v1")
            for node in c.nodes:
                bindir = node.root / NODE_BIN_DIR
                container_host.install_podman(node.root, bindir, [registry.endpoint])
                node.env["PATH"] = f"{bindir}{os.pathsep}{node.env['PATH']}"
            (c.master_root / allow.SETTING_FILE).write_text(f"{registry.endpoint}/team\n")
            c.start_executors()
            yield c, f"{registry.endpoint}/team/tiny", digest
        finally:
            stop_processes_of(job_user.pw_uid)
            for node in c.nodes:
                container_host.remove_podman(node.root)
            registry.stop()


def dl_run(c: LocalCluster, user, job_id: str, image: str) -> tuple[int, str]:
    master_bin = c.master_root / NODE_BIN_DIR  # the master's skopeo resolves the tag
    path = f"{master_bin}{os.pathsep}{users.login_env(user)['PATH']}"
    return users.dl(c, user, "dl-run", "--unmanaged", "--job-id", job_id, "--image", image,
                    "--rdzv-port", free_rdzv_port(c), "--start-timeout", "10", "--", "sh",
                    "-c", "id -u", extra_env={"PATH": path})


def test_an_image_job_is_pinned_pulled_once_per_node_and_a_failed_pull_is_infrastructure(
        cluster, job_user):
    c, repository, digest = cluster
    rc, out = dl_run(c, job_user, "wrong-tag", f"{repository}:v9")
    assert rc != 0 and f"tag 'v9' not found in {repository}" in out, out
    assert not (c.efs / "jobs" / job_user.pw_name / "wrong-tag.pull").exists()

    missing = f"{repository}@sha256:" + "e" * 64
    rc, out = dl_run(c, job_user, "missing", missing)
    assert rc != 0, out
    # every node told the same about the image: the job's input, not retried as the cluster's
    assert "cause: input (input)" in out and "user-code" not in out, out
    assert "failed on every node" in out, out
    for rank, address in enumerate(c.addresses):
        assert f"node rank {rank} ({address}): not found" in out, out
    assert not (c.efs / "jobs" / job_user.pw_name / "missing").exists()  # no rank ran

    rc, out = dl_run(c, job_user, "first", f"{repository}:v1")
    pinned = f"{repository}@{digest}"
    for rank, address in enumerate(c.addresses):
        assert f"[{rank} {address}] dl-container: pulling {pinned}" in out, out
        assert f"[{rank} {address}] dl-container: layer 1: sha256:" in out, out
        assert f"[{rank} {address}] dl-container: {pinned} pulled in " in out, out
    assert out.index("first.pull succeeded") < out.index("job first\n"), out

    rc, out = dl_run(c, job_user, "second", f"{repository}:v1")
    for rank, address in enumerate(c.addresses):
        assert f"[{rank} {address}] dl-container: {pinned} present, nothing pulled" in out, out
    assert "pulled in " not in out, out
