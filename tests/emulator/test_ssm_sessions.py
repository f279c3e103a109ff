"""Session Manager port forwarding on the emulator (emulator/ssm_sessions.py,
emulator/session_plugin.py): the real AWS CLI's ``aws ssm start-session`` against moto's
server, the plugin stand-in on PATH, bytes through the forwarded port to a server on the
(emulated) instance's loopback; SSM's refusals for a target without a connected agent and
for a document that is not a Session document."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from botocore.exceptions import ClientError

from bootstrap_scripts.node.procgroup import stop_popen_group
from emulator import session_plugin, ssm_agent
from tests.conftest import free_port

IID = "i-0123456789abcdef0"
#: the pinned AWS CLI of this environment (requirements), beside the interpreter
AWS = str(Path(sys.executable).with_name("aws")) if Path(sys.executable).with_name(
    "aws").exists() else (shutil.which("aws") or "aws")


@pytest.fixture()
def node(moto_reset: str) -> Iterator[str]:
    """An announced instance (its agent connected): a process group standing for it."""
    proc = subprocess.Popen(["sleep", "600"], process_group=0)
    ssm_agent.announce({"AWS_ENDPOINT_URL": moto_reset, "PATH": "/usr/bin:/bin"}, IID,
                       "/", proc.pid)
    try:
        yield moto_reset
    finally:
        proc.kill()
        proc.wait()


def ssm(endpoint: str):
    return boto3.client("ssm", endpoint_url=endpoint, region_name="us-east-1")


def forwarding(remote: int, local: int) -> dict:
    return {"portNumber": [str(remote)], "localPortNumber": [str(local)]}


@pytest.fixture()
def web() -> Iterator[int]:
    """A web server on the instance's loopback (this machine's, on the emulator)."""

    class Hello(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = f"hello {self.path}".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()


def test_aws_start_session_forwards_a_local_port_to_the_instance(node, web, tmp_path):
    endpoint, local = node, free_port()
    session_plugin.install(tmp_path / "bin")
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}",
           "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    p = subprocess.Popen(
        [AWS, "ssm", "start-session", "--target", IID, "--region", "us-east-1",
         "--endpoint-url", endpoint, "--document-name", "AWS-StartPortForwardingSession",
         "--parameters", json.dumps(forwarding(web, local))],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    try:
        lines = []
        deadline = time.monotonic() + 60
        while not any("Waiting for connections" in line for line in lines):
            assert p.poll() is None and time.monotonic() < deadline, "".join(lines)
            lines.append(p.stdout.readline())
        assert any(f"Port {local} opened for sessionId" in line for line in lines), lines
        with urllib.request.urlopen(f"http://127.0.0.1:{local}/through", timeout=10) as page:
            assert page.read() == b"hello /through"
        # Ctrl-C: SIGINT to the terminal's foreground group. The AWS CLI ignores it while
        # the plugin runs; the plugin ends the session, then the CLI exits.
        interrupted(p)
    finally:
        stop_popen_group(p)


def interrupted(p: subprocess.Popen) -> None:
    """SIGINT to ``p``'s process group, as Ctrl-C in its terminal: ``p`` must end."""
    os.killpg(p.pid, signal.SIGINT)
    try:
        p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("SIGINT to its process group (Ctrl-C) did not end the session")


def test_a_target_without_a_connected_agent_is_refused(moto_reset):
    with pytest.raises(ClientError, match="TargetNotConnected"):
        ssm(moto_reset).start_session(Target="i-0000000000000dead",
                                      DocumentName="AWS-StartPortForwardingSession",
                                      Parameters=forwarding(80, 8080))


def test_only_session_documents_and_real_ports(node):
    with pytest.raises(ClientError, match="InvalidDocument"):
        ssm(node).start_session(Target=IID, DocumentName="AWS-RunShellScript")
    with pytest.raises(ClientError, match="InvalidParameters"):
        ssm(node).start_session(Target=IID, DocumentName="AWS-StartPortForwardingSession",
                                Parameters={"portNumber": ["0"], "localPortNumber": ["1"]})


def test_the_plugin_forwards_nothing_without_the_sessions_token(node, tmp_path):
    started = ssm(node).start_session(Target=IID, DocumentName="AWS-StartPortForwardingSession",
                                      Parameters=forwarding(80, free_port()))
    forged = {**started, "TokenValue": "not-the-token"}
    with pytest.raises(SystemExit, match="refused"):
        session_plugin.session_of(forged, node)
    assert session_plugin.session_of(started, node)["target"] == IID
