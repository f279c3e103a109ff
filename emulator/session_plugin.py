"""A stand-in for AWS's Session Manager plugin, for port forwarding sessions on the emulator.

The AWS CLI's ``aws ssm start-session`` calls ``StartSession`` and then runs
``session-manager-plugin`` with the answer (in ``$AWS_SSM_START_SESSION_RESPONSE`` for
plugins from 1.2.497.0 on), the region, ``StartSession``, the profile, the request's
parameters (JSON: ``Target``, ``DocumentName``, ``Parameters``) and the endpoint. AWS's plugin
opens the session's data channel; for ``AWS-StartPortForwardingSession`` it listens on
``localhost:<localPortNumber>`` and the SSM Agent on the instance connects to
``localhost:<portNumber>`` there.

This stand-in asks the emulator's data channel (``emulator.ssm_sessions``) for the session
with the answer's id and token (no session, no forwarding), then listens on
``127.0.0.1:<localPortNumber>`` and joins each connection to ``127.0.0.1:<portNumber>``:
the emulated instance's loopback is this machine's (every emulated node runs here). It
prints what AWS's plugin prints and runs until it is stopped. It does not play interactive
shells. :func:`install` writes the ``session-manager-plugin`` command into a directory to put
first on ``PATH``, where a user would install AWS's.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

from emulator.ssm_sessions import PORT_FORWARDING, SESSIONS_PATH

#: what ``session-manager-plugin --version`` answers (recent enough for the AWS CLI to pass
#: the session in the environment)
VERSION = "1.2.764.0"
RESPONSE_ENV = "AWS_SSM_START_SESSION_RESPONSE"
HOST = "127.0.0.1"


def install(bin_dir: Path) -> Path:
    """Write the ``session-manager-plugin`` command (this interpreter, this module)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    plugin = bin_dir / "session-manager-plugin"
    repo = Path(__file__).resolve().parents[1]
    plugin.write_text(f"#!/bin/sh\nPYTHONPATH='{repo}'${{PYTHONPATH:+:$PYTHONPATH}} "
                      f"exec '{sys.executable}' -m emulator.session_plugin \"$@\"\n")
    plugin.chmod(0o755)
    return plugin


def session_of(response: dict, endpoint: str) -> dict:
    """The session the data channel answers for the response's id and token."""
    url = f"{endpoint.rstrip('/')}{SESSIONS_PATH}/{response['SessionId']}"
    req = urllib.request.Request(url, headers={"X-Session-Token": response["TokenValue"]})
    try:
        with urllib.request.urlopen(req, timeout=10) as page:
            return json.loads(page.read())
    except urllib.error.HTTPError as exc:
        raise SystemExit(f"session {response['SessionId']}: the data channel refused it "
                         f"({exc.code})") from None


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while chunk := src.recv(65536):
            dst.sendall(chunk)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


def forward(listener: socket.socket, remote_port: int, session_id: str) -> None:
    """Accept forever; each connection is joined to the instance's ``remote_port``."""
    while True:
        client, _ = listener.accept()
        print(f"Connection accepted for session [{session_id}]", flush=True)
        try:
            upstream = socket.create_connection((HOST, remote_port), timeout=10)
        except OSError as exc:
            print(f"Connection to destination port failed, check SSM Agent logs: {exc}",
                  flush=True)
            client.close()
            continue
        upstream.settimeout(None)
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pipe, args=(a, b), daemon=True).start()


def main(argv: list[str]) -> int:
    # The AWS CLI ignores SIGINT while the plugin runs, so Ctrl-C reaches the plugin alone;
    # AWS's plugin ends the session on it. An ignored SIGINT is inherited through exec and
    # Python then installs no handler of its own: take it back, as AWS's plugin does.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return serve(argv)
    except KeyboardInterrupt:
        print("\n\nExiting session (interrupted).", flush=True)
        return 0


def serve(argv: list[str]) -> int:
    if argv[:1] == ["--version"]:
        print(VERSION)
        return 0
    if len(argv) < 6 or argv[2] != "StartSession":
        print("session-manager-plugin (emulator stand-in): expects the AWS CLI's "
              "start-session arguments", file=sys.stderr)
        return 1
    raw = os.environ.get(argv[0], "") if argv[0] == RESPONSE_ENV else argv[0]
    response, request, endpoint = json.loads(raw), json.loads(argv[4]), argv[5]
    session = session_of(response, endpoint)
    if session["document"] != PORT_FORWARDING:
        print(f"session-manager-plugin (emulator stand-in): {session['document']} sessions "
              "are not played here; only port forwarding", file=sys.stderr)
        return 1
    if request.get("Target") != session["target"]:
        print(f"session-manager-plugin (emulator stand-in): session {response['SessionId']} "
              f"is for {session['target']}, not {request.get('Target')}", file=sys.stderr)
        return 1
    remote = int(session["parameters"]["portNumber"][0])
    local = int(session["parameters"]["localPortNumber"][0])
    print(f"\nStarting session with SessionId: {response['SessionId']}", flush=True)
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((HOST, local))
    listener.listen(16)
    print(f"Port {local} opened for sessionId {response['SessionId']}.", flush=True)
    print("Waiting for connections...\n", flush=True)
    forward(listener, remote, response["SessionId"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
