"""Identity from the fake IMDSv2 endpoint, through botocore's fetcher."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest

from bootstrap_scripts.agent.identity import IdentityError, NodeIdentity, fetch_identity
from emulator.imds import MetadataServer
from tests.conftest import free_port

IDENTITY = {"instance_id": "i-0abc", "instance_type": "p3.2xlarge", "address": "127.20.0.7",
            "region": "eu-west-1"}


def test_identity_via_env_endpoint(monkeypatch):
    with MetadataServer() as server:
        url = server.start("127.20.0.7", 0, IDENTITY)
        assert url.startswith("http://127.20.0.7:")
        monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", url)
        assert fetch_identity() == NodeIdentity("i-0abc", "p3.2xlarge", "127.20.0.7",
                                                "eu-west-1", "eu-west-1a")


def test_imdsv1_requests_are_refused():
    with MetadataServer() as server:
        url = server.start("127.0.0.1", 0, IDENTITY)
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(url + "latest/meta-data/instance-id", timeout=5)
        assert err.value.code == 401


def test_unreachable_endpoint_names_it():
    url = f"http://127.0.0.1:{free_port()}/"
    with pytest.raises(IdentityError, match=url.rstrip("/")):
        fetch_identity(url, timeout=0.2, attempts=1, deadline=0.5)


def test_metadata_server_rejects_identity_without_address():
    with pytest.raises(ValueError, match="'address'"):
        MetadataServer().start("127.0.0.1", 0, {"instance_id": "i-1", "address": ""})
