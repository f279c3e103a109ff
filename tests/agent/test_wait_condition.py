"""The wait-condition signal: body shape, empty Content-Type, empty handle, retries."""

from __future__ import annotations

import json
import logging

import pytest

from bootstrap_scripts.agent import wait_condition as wc
from emulator.wait_handle import WaitHandle
from tests.conftest import free_port


def test_body_has_the_cloudformation_fields():
    body = json.loads(wc.signal_body("SUCCESS", "4 nodes", "i-0abc", '{"nodes": 4}'))
    assert body == {"Status": "SUCCESS", "Reason": "4 nodes", "UniqueId": "i-0abc",
                    "Data": '{"nodes": 4}'}


def test_bad_status_is_rejected_by_name():
    with pytest.raises(ValueError, match="'DONE'"):
        wc.signal_body("DONE", "", "i-1")


def test_put_reaches_the_presigned_url_with_empty_content_type():
    recorder = WaitHandle()
    try:
        assert wc.signal(recorder.url, "FAILURE", "worker group: 0 of 3 launched", "i-m")
        (sig,) = recorder.wait_for(1, timeout=10)
        assert sig == {"Status": "FAILURE", "Reason": "worker group: 0 of 3 launched",
                       "UniqueId": "i-m", "Data": ""}
        assert recorder.headers[0].get("Content-Type", "") == ""
    finally:
        recorder.stop()


def test_empty_handle_means_nothing_to_signal(caplog):
    with caplog.at_level(logging.INFO):
        assert wc.signal("", "SUCCESS", "ok", "i-1")
    assert "nothing to signal" in caplog.text


def test_unreachable_handle_gives_up_after_the_attempts(monkeypatch):
    monkeypatch.setattr(wc.time, "sleep", lambda _s: None)
    url = f"http://127.0.0.1:{free_port()}/handle"
    assert wc.signal(url, "SUCCESS", "ok", "i-1", attempts=2, timeout=1) is False


@pytest.mark.parametrize("handle", ["", "None", "null", "s3://bucket/key"])
def test_a_handle_that_is_not_a_url_is_nothing_to_signal(handle, caplog, monkeypatch):
    def no_network(*_a, **_k):
        raise AssertionError("must not try to PUT to a non-URL handle")

    monkeypatch.setattr(wc.urllib.request, "urlopen", no_network)
    with caplog.at_level(logging.INFO):
        assert wc.signal(handle, wc.SUCCESS, "ready", "i-1") is True
    assert "nothing to signal" in caplog.text and repr(handle) in caplog.text
