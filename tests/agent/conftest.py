"""Fixtures shared by the agent tests that run master/worker agents as threads."""

from __future__ import annotations

import pytest

from tests.agent.fakecloud import SignalRecorder


@pytest.fixture()
def env(moto_reset, monkeypatch, tmp_path):
    """moto's server for boto3, no nvidia-smi on PATH (0 GPUs), a wait-condition recorder, and
    every agent thread a test starts (appended to the list) stopped at teardown."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_reset)
    monkeypatch.setenv("PATH", f"{tmp_path}/nobin:/usr/bin:/bin")
    recorder = SignalRecorder()
    threads: list = []
    try:
        yield moto_reset, recorder, threads
    finally:
        for t in threads:
            t.stop()
        recorder.stop()
