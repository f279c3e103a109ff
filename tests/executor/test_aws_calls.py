"""No AWS call on the executor's loop (``executor/aws_calls.py``, ``job_credentials.py``):
the STS call for a job's credentials runs on its own thread, the loop only looks; a call AWS
does not answer is given up as an outage (named as such), a refusal stays a refusal."""

from __future__ import annotations

import os
import threading
import time

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError

from bootstrap_scripts.jobs.executor.aws_calls import Calls, Outage, is_outage
from bootstrap_scripts.jobs.executor.job_credentials import (
    REFRESH_BEFORE_SECONDS,
    WAIT_SECONDS,
    CredentialsError,
    JobCredentials,
    JobCredentialStore,
)

ROLE = "arn:aws:iam::123456789012:role/dl-job"


def client_error(code: str, status: int) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": code},
                        "ResponseMetadata": {"HTTPStatusCode": status}}, "AssumeRole")


@pytest.mark.parametrize(("exc", "outage"), [
    (ReadTimeoutError(endpoint_url="http://sts"), True),
    (EndpointConnectionError(endpoint_url="http://sts"), True),
    (ConnectionResetError(104, "reset"), True),
    (TimeoutError(), True),
    (client_error("ServiceUnavailable", 503), True),
    (client_error("InternalFailure", 500), True),
    (client_error("Throttling", 400), True),
    (client_error("AccessDenied", 403), False),
    (client_error("ValidationError", 400), False),
    (RuntimeError("AccessDenied: not authorized"), False),
    (ValueError("bad"), False),
])
def test_an_outage_is_no_answer_and_a_refusal_is_an_answer(exc, outage):
    assert is_outage(exc) is outage
    wrapped = CredentialsError("sts:AssumeRole failed")
    wrapped.__cause__ = exc  # as ``raise ... from exc`` sets it
    assert is_outage(wrapped) is outage


class SilentSts:
    """STS as a stopped endpoint is: the call never returns until released."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0

    def assume_role(self, **_kwargs):
        self.calls += 1
        self.release.wait(60)
        raise ReadTimeoutError(endpoint_url="http://sts")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def silent_store(tmp_path) -> tuple[JobCredentialStore, SilentSts, Clock]:
    sts, clock = SilentSts(), Clock()
    store = JobCredentialStore(tmp_path / "jc", ROLE, "us-east-1", lambda: sts)
    store.calls = Calls(clock=clock)
    return store, sts, clock


def test_a_silent_sts_never_holds_the_loop_and_is_named_an_outage(tmp_path):
    store, sts, clock = silent_store(tmp_path)
    try:
        t0 = time.monotonic()
        store.begin("alice/train-1", "alice", os.getuid(), os.getgid())
        assert not store.settled("alice/train-1")  # the share waits, the loop goes on
        clock.now += WAIT_SECONDS - 1
        assert not store.settled("alice/train-1")
        clock.now += 2
        assert store.settled("alice/train-1")
        with pytest.raises(CredentialsError, match="AWS did not answer within") as raised:
            store.collect("alice/train-1")
        assert raised.value.outage
        assert time.monotonic() - t0 < WAIT_SECONDS  # none of it waited on STS
        assert sts.calls == 1 and not (store.base / "alice.train-1").exists()
    finally:
        sts.release.set()


def test_an_sts_timeout_is_an_outage_and_an_access_denied_a_refusal(tmp_path):
    class Answering:
        def __init__(self, exc: Exception) -> None:
            self.exc = exc

        def assume_role(self, **_kwargs):
            raise self.exc

    for exc, outage in ((ReadTimeoutError(endpoint_url="http://sts"), True),
                        (client_error("AccessDenied", 403), False)):
        store = JobCredentialStore(tmp_path / "jc", ROLE, "us-east-1",
                                   lambda e=exc: Answering(e))
        store.begin("j", "bob", os.getuid(), os.getgid())
        store.calls.calls["j"].done.wait(30)
        with pytest.raises(CredentialsError, match=r"sts:AssumeRole on the job role") as r:
            store.collect("j")
        assert r.value.outage is outage, r.value
        assert "j" not in store.owners and not store.calls.under_way("j")


def test_a_renewal_during_an_outage_keeps_the_loop_going_and_the_old_credentials(tmp_path):
    store, sts, clock = silent_store(tmp_path)
    try:
        expires = time.time() + REFRESH_BEFORE_SECONDS - 5  # due now
        store.jobs["j"] = JobCredentials(store.base / "j", expires)
        owners = {"j": ("carol", os.getuid(), os.getgid())}
        t0 = time.monotonic()
        assert store.refresh_due(owners) == []
        assert store.refresh_due(owners) == []  # still under way: one call, not two
        assert sts.calls == 1 and time.monotonic() - t0 < 5
        clock.now += WAIT_SECONDS + 1
        assert store.refresh_due(owners) == ["j"]  # given up, logged; the old ones stay
        assert store.jobs["j"].expiration == expires
    finally:
        sts.release.set()


def test_a_late_answer_after_the_job_ended_is_dropped(tmp_path):
    calls = Calls()
    gate = threading.Event()
    calls.start("k", lambda: gate.wait(30) and "late", wait=60)
    calls.drop("k")  # the job ended while the call ran
    gate.set()
    assert not calls.under_way("k")
    with pytest.raises(KeyError):
        calls.poll("k")


def test_poll_hands_back_the_answer_or_the_refusal():
    calls = Calls()
    calls.start("ok", lambda: {"answer": 1}, wait=60)
    calls.calls["ok"].done.wait(30)
    assert calls.poll("ok") == (True, {"answer": 1}) and not calls.under_way("ok")

    def refuse():
        raise client_error("AccessDenied", 403)

    calls.start("no", refuse, wait=60)
    calls.calls["no"].done.wait(30)
    with pytest.raises(ClientError):
        calls.poll("no")

    def silent():
        raise EndpointConnectionError(endpoint_url="http://sts")

    calls.start("down", silent, wait=60)
    calls.calls["down"].done.wait(30)
    with pytest.raises(Outage, match="AWS did not answer"):
        calls.poll("down")
