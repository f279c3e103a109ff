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

# A suite started in the background by a shell (`make test &`, nohup) inherits SIGINT
# ignored, and every process the tests start would inherit that too: the tests that press
# Ctrl-C on a demo, a dl-run follower or the kept cluster's parent would see nothing happen.
# Python's own handler here means the processes the tests start get SIGINT's default.
signal.signal(signal.SIGINT, signal.default_int_handler)


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
