"""The master agent's AWS clients are made only once the instance role's credentials can
be found: a client created while instance metadata is slow to answer would have none for
its whole life (every call "Unable to locate credentials")."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from bootstrap_scripts.agent.aws import MasterAws
from bootstrap_scripts.node import node_region


def test_clients_wait_for_credentials_then_have_them(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                 "AWS_PROFILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance role yet
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    stop = threading.Event()
    aws = MasterAws(region="us-east-1", queue_url="q", cluster_id="c", stop=stop,
                    log=logging.getLogger("test-master-aws"))
    with caplog.at_level(logging.WARNING, logger="test-master-aws"):
        aws.start()
        assert not stop.wait(1.5)
        assert aws.sqs is None  # still waiting: no client without credentials
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
        assert aws.ready()
    assert aws.sqs._request_signer._credentials.access_key == "AKIAEXAMPLE"
    assert "event=no-credentials-yet" in caplog.text


def test_the_region_file_makes_the_sdk_patient_with_instance_metadata() -> None:
    text = node_region.render_env_file("eu-west-3")
    assert "AWS_METADATA_SERVICE_TIMEOUT=5\n" in text
    assert "AWS_METADATA_SERVICE_NUM_ATTEMPTS=3\n" in text
