"""Shared fixtures: moto's server over HTTP, dummy credentials, and process hygiene."""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from emulator.cloud import Cloud

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REGION = "us-east-1"

# `make test` runs pytest-xdist workers side by side: each worker's emulated clusters get a
# network of their own (emulator.address_space), so two workers' nodes never share an address
# and meet on a fixed port. Set before any emulator module reads it; a run without xdist keeps
# the default. (The emulator's module is tiny and imports nothing of the product.)
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _WORKER.startswith("gw"):
    from emulator.address_space import VPC_CIDR_ENV, vpc_for

    os.environ.setdefault(VPC_CIDR_ENV, vpc_for(int(_WORKER[2:])))

# A suite started in the background by a shell (`make test &`, nohup) inherits SIGINT
# ignored, and every process the tests start would inherit that too: the tests that press
# Ctrl-C on a demo, a dl-run follower or the kept cluster's parent would see nothing happen.
# Python's own handler here means the processes the tests start get SIGINT's default.
signal.signal(signal.SIGINT, signal.default_int_handler)


#: The files whose tests boot whole emulated clusters of their own (the demo's). Under
#: pytest-xdist (`make test`) they run one after another on one worker, starting first (the
#: longest share of the run); every other file runs whole on whichever worker is free. One
#: demo cluster at a time keeps their timings what they are without xdist.
#: (``tests/cli/test_up_down.py`` deploys and deletes the stack but boots no node: it runs
#: on the other worker, beside them.)
DEMO_CLUSTER_FILES = ("tests/e2e/", "tests/cli/test_e2e.py")
DEMO_CLUSTERS = "demo-clusters"


def test_file_scope(nodeid: str) -> str:
    """The unit xdist hands one worker: the demo-cluster files together, else the file."""
    path = nodeid.split("::", 1)[0]
    return DEMO_CLUSTERS if path.startswith(DEMO_CLUSTER_FILES) else path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """xdist's scheduling by scope (its ``--dist loadfile``), with :func:`test_file_scope`
    as the scope; with ``--no-loadscope-reorder`` the scopes go out in collection order,
    the demo clusters' first (:func:`pytest_collection_modifyitems`)."""
    from xdist.scheduler import LoadScopeScheduling

    class DemoClustersTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:  # xdist's override point for a scope
            return test_file_scope(nodeid)

    return DemoClustersTogether(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist, the demo-cluster files first (the longest scope starts first)."""
    if _WORKER:
        items.sort(key=lambda item: test_file_scope(item.nodeid) != DEMO_CLUSTERS)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@pytest.fixture(autouse=True)
def _dummy_aws_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test may ever reach a real AWS account."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_REGION", REGION)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    # nor wait on 169.254.169.254: a test that wants instance metadata starts emulator.imds
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture(scope="session")
def emulator_cloud() -> Iterator[Cloud]:
    """The emulator's AWS (``emulator.cloud``): moto's real HTTP server on localhost (not an
    in-process mock) plus its control endpoint, in this process, stopped at the end."""
    from emulator.cloud import Cloud

    server = Cloud(free_port("localhost"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def moto_endpoint(emulator_cloud: Cloud) -> str:
    return emulator_cloud.endpoint


@pytest.fixture()
def moto_reset(emulator_cloud: Cloud) -> Iterator[str]:
    """A clean moto state for one test (the server is shared by the session)."""
    emulator_cloud.reset()
    yield emulator_cloud.endpoint


@pytest.fixture()
def emu(tmp_path) -> Iterator:
    """Factory: ``emu(n_nodes, gpus=0, instances=None)`` -> a LocalCluster
    (``tests.support.cluster``; nothing started yet), for the runner, job and ops suites.

    Teardown stops every process it started (by PID / process group), the controllers'
    attempt runners included, and fails the test if any of them, or any process of a job
    share, is still alive afterwards."""
    from tests.support.cluster import start_local_cluster

    clusters: list = []

    def factory(n_nodes: int, gpus: int = 0, **kwargs):
        c = start_local_cluster(tmp_path / f"cluster{len(clusters)}", n_nodes, gpus, **kwargs)
        clusters.append(c)
        return c

    yield factory
    leftovers = set()
    for c in clusters:
        c.stop()
        leftovers |= c.leftovers()
    assert not leftovers, f"processes left behind: {sorted(leftovers)}"
