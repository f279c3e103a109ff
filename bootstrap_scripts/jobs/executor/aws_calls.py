"""AWS calls off the executor's loop: each runs on a thread of its own, the loop only looks.

WHY: the executor's one loop writes the node's heartbeat; every runner and the job
controller judge the node alive by it. A call to AWS that does not answer (an outage, a
network partition to the endpoint, a throttled API) must never stop that heartbeat, or a
healthy node is declared lost, its job restarted and the node possibly replaced for AWS's
fault. So a call is started here and the loop asks, at each pass, whether it has ended:
:meth:`Calls.poll` never blocks. A call still unanswered after its ``wait`` is given up as
an outage (:class:`Outage`); its thread ends on its own (botocore's timeouts bound it) and
its late answer is dropped.

Whether a failed call is an outage (AWS did not answer, or answered that it could not:
5xx, throttling) or a refusal (AccessDenied, a bad request) is :func:`is_outage`: an outage
is nobody's fault on the cluster; a refusal is an answer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: botocore's exceptions (by class name: this module imports no SDK) and Python's own that
#: mean "no answer": no connection, a connection reset, a timeout.
NO_ANSWER = frozenset({"ConnectionError", "ConnectTimeoutError", "ReadTimeoutError",
                       "EndpointConnectionError", "ConnectionClosedError", "HTTPClientError",
                       "TimeoutError", "ProxyConnectionError", "SSLError"})
#: Error codes with which AWS says it cannot answer now (the SDKs retry them too).
UNAVAILABLE = frozenset({"Throttling", "ThrottlingException", "RequestLimitExceeded",
                         "ServiceUnavailable", "InternalFailure", "InternalError",
                         "RequestTimeout", "RequestTimeoutException", "SlowDown",
                         "PriorRequestNotComplete", "IDPCommunicationError"})
#: botocore's client settings for a call made here: a short connect and read timeout and
#: one retry, so that a thread waiting on a silent endpoint ends within about 2 x 5 s.
CLIENT_CONFIG: dict[str, Any] = {"connect_timeout": 5, "read_timeout": 5,
                                 "retries": {"total_max_attempts": 2, "mode": "standard"}}
#: Calls nobody collected (their job settled before they ended) are dropped this long after
#: they started.
FORGOTTEN_AFTER_SECONDS = 600.0


def is_outage(exc: BaseException | None) -> bool:
    """Did AWS fail to answer (True) rather than refuse (False)? Pure: the class names and,
    for an answer, the HTTP status and error code of ``exc`` or of an error it wraps
    (``raise ... from``)."""
    seen = 0
    while exc is not None and seen < 8:
        if {c.__name__ for c in type(exc).__mro__} & NO_ANSWER:
            return True
        response = getattr(exc, "response", None)
        if isinstance(response, dict):
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
            code = response.get("Error", {}).get("Code", "")
            return (isinstance(status, int) and status >= 500) or code in UNAVAILABLE
        exc, seen = exc.__cause__, seen + 1
    return False


class Outage(RuntimeError):
    """AWS did not answer a call within its wait (or answered that it could not)."""


@dataclass
class Call:
    """One call on its thread: its result or error once ``done`` is set."""

    started: float
    wait: float
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None


class Calls:
    """Calls keyed by a name (a job's key), each on a daemon thread; at most one per name."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.calls: dict[str, Call] = {}

    def start(self, key: str, fn: Callable[[], Any], wait: float) -> None:
        """Start ``fn`` for ``key`` unless a call for it is already under way."""
        now = self.clock()
        for old in [k for k, c in self.calls.items()
                    if now - c.started > max(c.wait, FORGOTTEN_AFTER_SECONDS)]:
            del self.calls[old]
        if key in self.calls:
            return
        call = Call(now, wait)
        self.calls[key] = call

        def run() -> None:
            try:
                call.result = fn()
            except Exception as exc:  # handed to the loop, which decides
                call.error = exc
            finally:
                call.done.set()

        threading.Thread(target=run, name=f"aws-{key}", daemon=True).start()

    def under_way(self, key: str) -> bool:
        return key in self.calls

    def poll(self, key: str) -> tuple[bool, Any]:
        """``(False, None)`` while the call for ``key`` runs within its wait; else
        ``(True, result)``, or the call's error raised (:class:`Outage` for a call that
        outlived its wait, or failed for want of an answer: :func:`is_outage`). A call
        that ended is forgotten; KeyError if there is none."""
        call = self.calls[key]
        if not call.done.is_set():
            waited = self.clock() - call.started
            if waited <= call.wait:
                return False, None
            del self.calls[key]
            raise Outage(f"AWS did not answer within {call.wait:.0f} s (an AWS outage or no "
                         f"route to its endpoint)")
        del self.calls[key]
        if call.error is not None:
            if is_outage(call.error):
                raise Outage(f"{call.error} (AWS did not answer: an outage)") from call.error
            raise call.error
        return True, call.result

    def drop(self, key: str) -> None:
        """Nobody wants the call's answer any more (its job ended)."""
        self.calls.pop(key, None)
