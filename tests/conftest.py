"""Shared fixtures: moto's server over HTTP, dummy credentials, and process hygiene."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REGION = "us-east-1"


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


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """moto's real HTTP server on localhost (not an in-process mock), stopped at the end."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="localhost", port=port, verbose=False)
    server.start()
    try:
        yield f"http://localhost:{port}"
    finally:
        server.stop()


@pytest.fixture()
def moto_reset(moto_endpoint: str) -> Iterator[str]:
    """A clean moto state for one test (the server is shared by the session)."""
    import urllib.request

    urllib.request.urlopen(
        urllib.request.Request(f"{moto_endpoint}/moto-api/reset", method="POST"), timeout=10
    ).read()
    yield moto_endpoint
