"""The emulated AWS side: moto's server plus a small control endpoint for what moto lacks.

    python -m emulator.cloud --port 5000 --state-dir DIR

prints one JSON line ``{"endpoint": "http://localhost:5000", "control": "http://..."}``
when both listen, then serves until SIGTERM. It is a process of its own (not a thread of
the demo) so that ``--keep`` can leave the cluster running after the demo exits.

moto runs in THIS process (``ThreadedMotoServer``), which is what lets the control
endpoint reach moto's backend for the one state its API cannot produce:

- ``POST /fail-launches {"group": NAME, "count": K}``: K launches of the group failed.
  moto always fills a group to its desired capacity, so, as the Lambda tests do, the last
  K instances are removed from the group's backend list and terminated in EC2: desired
  stays at N while only N-K instances exist, which is what AWS shows after launch errors.
- ``PUT /wait-handle``: a stand-in for the presigned wait-condition URL (moto resolves the
  handle to ''); signals are kept and listed by ``GET /signals`` (see ``emulator.wait_handle``).
- ``GET /published?after=SEQ``: what Auto Scaling published to SNS topics since ``SEQ``
  (``emulator.notifications.TopicSubscription`` delivers it to the Lambda handler).
- ``POST /flaky-launches {"count": N, "tag": "KEY=VALUE"}``: the next N launches of the
  groups with that tag fail for capacity, then launches succeed (``emulator.capacity``);
  ``GET /flaky-launches``: how many are left and how many failed.
- ``POST /spot-interruption {"instance_id": ID}``: EC2 interrupts a group's Spot instance
  (``emulator.lifecycle_hooks.spot_interruption``).
- ``POST /iam-enforcement {"enabled": true|false}``: moto's IAM authorization on from now on
  (the harness's ``testing`` keys then act as the account's administrator) or off again
  (``emulator.iam_enforcement``; the demo's ``--enforce-iam`` turns it on after the deploy).

Attributes and APIs moto lacks are added to moto's models in this process by
``emulator.moto_extensions`` (the one place where the emulator extends moto).

Tests run the same pair in their own process (:class:`Cloud`), so they can also reach moto's
backends directly; ``POST /moto-api/reset`` on the endpoint gives a test a clean account.
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from emulator import (
    capacity,
    iam_enforcement,
    lifecycle_hooks,
    moto_custom_resources,
    moto_extensions,
    moto_publishing,
)
from emulator.wait_handle import parse_signal

ACCOUNT = "123456789012"
REGION = "us-east-1"


def port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        # SO_REUSEADDR as the servers themselves use: connections in TIME_WAIT from a
        # previous run do not make the port "in use", a listener does.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def fail_launches(group_name: str, count: int, region: str = REGION) -> list[str]:
    """Remove the last ``count`` instances from the group (backend) and terminate them."""
    from moto.autoscaling.models import autoscaling_backends
    from moto.ec2.models import ec2_backends

    groups = autoscaling_backends[ACCOUNT][region].autoscaling_groups
    if group_name not in groups:
        raise KeyError(f"no Auto Scaling group {group_name!r} (have: {sorted(groups)})")
    group = groups[group_name]
    if not 0 < count <= len(group.instance_states):
        raise ValueError(f"cannot fail {count} launch(es) of {group_name}: it has "
                         f"{len(group.instance_states)} instance(s)")
    dropped = group.instance_states[-count:]
    group.instance_states = group.instance_states[:-count]
    ids = [state.instance.id for state in dropped]
    ec2_backends[ACCOUNT][region].terminate_instances(ids)
    return ids


class _Control(BaseHTTPRequestHandler):
    server: _ControlServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # the demo prints what matters
        pass

    def _reply(self, code: int, payload: object) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        if url.path == "/published":
            after = urllib.parse.parse_qs(url.query).get("after", ["0"])[0]
            self._reply(200, moto_publishing.published(int(after) if after.isdigit() else 0))
        elif self.path == "/flaky-launches":
            self._reply(200, capacity.flaky_state())
        elif self.path == "/signals":
            self._reply(200, self.server.signals)
        elif self.path == "/health":
            self._reply(200, {"ok": True})
        else:
            self._reply(404, {"error": f"no such path {self.path}"})

    def do_PUT(self) -> None:
        body = self._body()
        if not self.path.startswith("/wait-handle"):
            self._reply(404, {"error": f"no such path {self.path}"})
            return
        record = parse_signal(body)
        record["_content_type"] = self.headers.get("Content-Type", "")
        with self.server.lock:
            self.server.signals.append(record)
            if self.server.state_dir is not None:
                with open(self.server.state_dir / "signals.jsonl", "a") as fh:
                    fh.write(json.dumps(record) + "\n")
        self._reply(200, {"ok": True})

    def do_POST(self) -> None:
        if self.path not in ("/fail-launches", "/spot-interruption", "/capacity-out",
                             "/flaky-launches", "/iam-enforcement"):
            self._reply(404, {"error": f"no such path {self.path}"})
            return
        try:
            req = json.loads(self._body() or b"{}")
            region = str(req.get("region", REGION))
            if self.path == "/capacity-out":  # emulator.capacity: these types have none
                self._reply(200, {"out": capacity.set_out([str(x) for x in req["out"]])})
                return
            if self.path == "/flaky-launches":  # emulator.capacity: fail N, then succeed
                self._reply(200, capacity.set_flaky(int(req["count"]), str(req["tag"])))
                return
            if self.path == "/iam-enforcement":  # emulator.iam_enforcement
                if req.get("enabled", True):
                    admin = iam_enforcement.enable(ACCOUNT)
                else:
                    admin, _ = "", iam_enforcement.disable()
                self._reply(200, {"enabled": iam_enforcement.enabled(), "admin_role": admin})
                return
            if self.path == "/spot-interruption":
                self._reply(200, lifecycle_hooks.spot_interruption(
                    str(req["instance_id"]), ACCOUNT, region))
                return
            ids = fail_launches(str(req["group"]), int(req["count"]), region)
        except (KeyError, ValueError, TypeError) as exc:
            self._reply(400, {"error": str(exc)})
            return
        self._reply(200, {"instance_ids": ids})


class _ControlServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], state_dir: Path | None) -> None:
        super().__init__(address, _Control)
        self.state_dir = state_dir
        self.signals: list[dict] = []
        self.lock = threading.Lock()


class Cloud:
    """moto's server on ``localhost:port`` plus the control endpoint, both in this process.

    ``state_dir`` (optional) receives ``signals.jsonl``. ``stop()`` stops both."""

    def __init__(self, port: int, state_dir: Path | None = None) -> None:
        from moto.server import ThreadedMotoServer

        moto_extensions.install()  # what moto lacks that AWS has, before it serves

        if state_dir is not None:
            state_dir.mkdir(parents=True, exist_ok=True)
        self._moto = ThreadedMotoServer(ip_address="localhost", port=port, verbose=False)
        self._moto.start()
        self._control = _ControlServer(("localhost", 0), state_dir)
        threading.Thread(target=self._control.serve_forever, daemon=True,
                         name="control").start()
        self.endpoint = f"http://localhost:{port}"
        moto_custom_resources.serve_at(self.endpoint)  # custom resources it answers call it
        self.control = f"http://localhost:{self._control.server_address[1]}"

    def reset(self) -> None:
        """A clean account: every resource gone (moto's reset API), no signal recorded."""
        import urllib.request

        urllib.request.urlopen(urllib.request.Request(
            f"{self.endpoint}/moto-api/reset", method="POST"), timeout=60).read()
        with self._control.lock:
            self._control.signals.clear()
        moto_extensions.reset()

    def stop(self) -> None:
        self._control.shutdown()
        self._control.server_close()
        self._moto.stop()


def free_port(host: str = "localhost") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="moto's server + the emulator's control endpoint")
    p.add_argument("--port", type=int, required=True, help="moto's port on localhost")
    p.add_argument("--state-dir", required=True, help="where signals.jsonl is written")
    ns = p.parse_args(argv)
    if not port_free("localhost", ns.port):
        print(json.dumps({"error": f"port {ns.port} on localhost is already in use"}),
              flush=True)
        return 3
    cloud = Cloud(ns.port, Path(ns.state_dir))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    print(json.dumps({"endpoint": cloud.endpoint, "control": cloud.control}), flush=True)
    stop.wait()
    cloud.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
