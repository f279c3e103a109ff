"""The stack's wait-condition handle, played locally: a URL the master agent signals.

On AWS the handle (``AWS::CloudFormation::WaitConditionHandle``) resolves to a presigned S3
URL; the master agent PUTs one JSON body to it (``Status``, ``Reason``, ``UniqueId``,
``Data``) with an EMPTY Content-Type, since the signature covers the Content-Type header.
moto resolves the handle to ``''``, so the emulator serves the URL itself:

- :class:`WaitHandle`: an in-process server for one test or one cluster; ``url`` looks
  presigned (a query string full of ``%``-escapes, which the installer must escape for
  systemd), ``signals`` are the bodies received and ``headers`` their request headers;
- ``emulator.cloud``'s control endpoint (``PUT /wait-handle``, ``GET /signals``) for the demo,
  which records what :func:`parse_signal` returns plus the Content-Type.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

#: What a presigned handle URL's query looks like (signature, expiry), path included.
PRESIGNED_SUFFIX = "/waitcondition/handle?X-Amz-Signature=ab%2Fcd&X-Amz-Expires=86400"


def parse_signal(body: bytes) -> dict:
    """The signal a PUT carried: its JSON object, or ``{"raw": text}`` if it is not JSON."""
    try:
        value = json.loads(body or b"{}")
    except ValueError:
        return {"raw": body.decode(errors="replace")}
    return value if isinstance(value, dict) else {"raw": body.decode(errors="replace")}


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # quiet: tests start many of these
        pass

    def do_PUT(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.handle.record(parse_signal(body), dict(self.headers))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], handle: WaitHandle) -> None:
        super().__init__(address, _Handler)
        self.handle = handle


class WaitHandle:
    """A wait-condition handle on ``host`` (any free port), served from a daemon thread."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.signals: list[dict] = []
        self.headers: list[dict] = []
        self._cond = threading.Condition()
        self._server = _Server((host, 0), self)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="wait-handle")
        self._thread.start()
        bound_host, port = self._server.server_address[:2]
        self.url = f"http://{bound_host}:{port}{PRESIGNED_SUFFIX}"

    def record(self, signal: dict, headers: dict) -> None:
        with self._cond:
            self.headers.append(headers)
            self.signals.append(signal)
            self._cond.notify_all()

    def wait_for(self, count: int = 1, timeout: float = 60.0) -> list[dict]:
        """The signals received once there are ``count`` of them (or fewer at ``timeout``)."""
        with self._cond:
            self._cond.wait_for(lambda: len(self.signals) >= count, timeout=timeout)
            return list(self.signals)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> WaitHandle:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
