"""Drill: a user's job cannot get the instance role's credentials from its node's IMDS.

The node's boot (the installer the user data runs) installs a netfilter owner-match rule for
the metadata endpoint it is told through botocore's own setting (``AWS_EC2_METADATA_SERVICE_
ENDPOINT``, how the emulator gives each node its own fake IMDS on a 127.x address; on AWS
nobody sets it and the rule names 169.254.169.254). Then a real unprivileged user's process
gets "connection refused" for an IMDSv2 token while root's agents still read the node's
identity; before the boot ran, the same user got a token, so the drill fails without the
guard. Where netfilter cannot be used here (no iptables, no CAP_NET_ADMIN) the drill is
skipped and says why; the exact commands are checked by the unit tests below regardless.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootstrap_scripts.agent import imds_guard
from bootstrap_scripts.agent.identity import fetch_identity
from emulator.imds import MetadataServer
from emulator.nodes import PYTHON, base_env
from emulator.resources import agent_settings, install_args, loopback_instances
from tests.conftest import REPO_ROOT
from tests.security.node_fixtures import job_user, reachable_python  # noqa: F401 - fixtures

#: What a job would run: IMDSv2's token request, standard library only; exit 0 with a token.
ASK_FOR_TOKEN = """
import sys, urllib.request
req = urllib.request.Request(sys.argv[1] + "latest/api/token", method="PUT",
                             headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"})
try:
    token = urllib.request.urlopen(req, timeout=5).read()
except OSError as exc:
    print(f"refused: {exc}")
    sys.exit(3)
print("token", len(token))
"""


def netfilter_usable() -> str:
    """Why the kernel's netfilter cannot be driven here ("" when it can)."""
    if os.geteuid() != 0:
        return "needs root (CAP_NET_ADMIN) and a user to create"
    if not shutil.which("iptables"):
        return "iptables is not installed (apt-get install iptables)"
    res = subprocess.run(["iptables", "-w", "-S", "OUTPUT"], capture_output=True, text=True,
                         check=False)
    return "" if res.returncode == 0 else f"iptables cannot read OUTPUT: {res.stderr.strip()}"


@pytest.fixture()
def node_imds() -> Iterator[tuple[str, Path]]:
    """A node's own fake metadata service on its own loopback address, and its root."""
    inst = loopback_instances(1)[0]
    server = MetadataServer()
    url = server.start(inst.address, 0, {"instance_id": inst.instance_id,
                                         "address": inst.address, "region": "us-east-1"})
    tmp = Path(tempfile.mkdtemp(prefix="dl-imds-guard-"))
    try:
        yield url, tmp / "root"
    finally:
        imds_guard.remove(url)  # the machine goes away with its rules (emulator.nodes does so)
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def ask_as(user, url: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-c", ASK_FOR_TOKEN, url], capture_output=True, text=True,
                          timeout=30, user=user.pw_uid, group=user.pw_gid, extra_groups=[],
                          env={"PATH": "/usr/bin:/bin", "HOME": user.pw_dir}, check=False)


@pytest.mark.skipif(bool(netfilter_usable()), reason=netfilter_usable() or "-")
def test_a_users_job_gets_no_token_from_its_nodes_imds_root_still_does(
        node_imds, job_user, reachable_python):  # noqa: F811
    url, root = node_imds
    before = ask_as(job_user, url)
    assert before.returncode == 0 and "token" in before.stdout, before  # the hole the guard closes

    env = {**base_env(), "AWS_EC2_METADATA_SERVICE_ENDPOINT": url,
           "AWS_EC2_METADATA_DISABLED": "false"}
    settings = agent_settings("worker", cluster_id="sec-imds", mount_point=str(root / "efs"))
    boot = subprocess.run(
        [PYTHON, "-m", "bootstrap_scripts.agent.install", "--no-systemctl", "--python", PYTHON,
         "--package-dir", str(REPO_ROOT), *install_args(settings), "--root", str(root),
         "--no-mount"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=90,
        check=False)
    assert boot.returncode == 0, boot.stdout + boot.stderr
    assert "only root reaches instance metadata" in boot.stdout, boot.stdout

    after = ask_as(job_user, url)
    assert after.returncode == 3 and "refused" in after.stdout, after
    assert fetch_identity(url, deadline=10).region == "us-east-1"  # root's agents: untouched
    # bridged containers' packets are forwarded, not sent: the FORWARD rule is in the kernel
    assert forward_rule_installed(url)


def forward_rule_installed(url: str) -> bool:
    address, _port = imds_guard.target(url)
    return subprocess.run(["iptables", "-w", "-C", "FORWARD", *imds_guard.forward_rule(address)],
                          capture_output=True, check=False).returncode == 0


@pytest.mark.skipif(bool(netfilter_usable()), reason=netfilter_usable() or "-")
def test_forwarded_traffic_to_imds_is_dropped_and_the_rule_goes_with_the_node():
    """A container on a bridge reaches IMDS through FORWARD, where no owner match applies:
    the guard drops every forwarded packet to the metadata address, installed once however
    often the guard runs, and taken away with the node."""
    url = "http://127.20.255.254:41999/"
    try:
        assert not forward_rule_installed(url)
        imds_guard.ensure(url)
        assert imds_guard.ensure(url).endswith("(already there)")
        assert forward_rule_installed(url)
        rules = subprocess.run(["iptables", "-w", "-S", "FORWARD"], capture_output=True,
                               text=True, check=True).stdout
        assert sum("127.20.255.254/32" in line for line in rules.splitlines()) == 1
    finally:
        imds_guard.remove(url)
    assert not forward_rule_installed(url)


def test_the_rule_is_an_owner_match_that_lets_only_root_through():
    assert imds_guard.rule("169.254.169.254", 80) == [
        "-d", "169.254.169.254/32", "-p", "tcp", "--dport", "80",
        "-m", "owner", "!", "--uid-owner", "0",
        "-m", "comment", "--comment", "dl-imds-root-only",
        "-j", "REJECT", "--reject-with", "tcp-reset"]
    script = imds_guard.nft_script("169.254.169.254", 80)
    assert "ip daddr 169.254.169.254 tcp dport 80 meta skuid != 0 reject with tcp reset" \
        in script
    assert script.startswith("table inet dl_imds_guard\ndelete table inet dl_imds_guard\n")


def test_the_forward_rule_drops_every_forwarded_packet_to_imds():
    assert imds_guard.forward_rule("169.254.169.254") == [
        "-d", "169.254.169.254/32", "-m", "comment", "--comment", "dl-imds-no-forward",
        "-j", "DROP"]
    script = imds_guard.nft_script("169.254.169.254", 80)
    forward = script[script.index("chain forward"):]
    assert "type filter hook forward priority 0;" in forward
    assert "ip daddr 169.254.169.254 drop" in forward


@pytest.mark.parametrize(("endpoint", "target"), [
    ("http://169.254.169.254/", ("169.254.169.254", 80)),  # AWS: what botocore defaults to
    ("http://127.20.128.5:41234/", ("127.20.128.5", 41234)),  # an emulated node's
])
def test_the_guarded_target_is_the_endpoint_botocore_names(endpoint, target):
    assert imds_guard.target(endpoint) == target


@pytest.mark.parametrize("endpoint", ["http://[fd00:ec2::254]/", "http://metadata.local/"])
def test_an_endpoint_no_rule_can_name_exactly_is_refused(endpoint):
    with pytest.raises(imds_guard.GuardError, match="cannot guard"):
        imds_guard.target(endpoint)


def test_nothing_to_guard_when_metadata_is_switched_off(monkeypatch):
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    assert imds_guard.ensure() == ""


def test_no_netfilter_tool_fails_closed(monkeypatch):
    """Without iptables or nft the guard refuses (the installer and the executor then stop)
    rather than leave the role in every job's reach."""
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "false")
    monkeypatch.setattr(imds_guard.shutil, "which", lambda _name: None)
    with pytest.raises(imds_guard.GuardError, match="neither iptables nor nft"):
        imds_guard.ensure("http://169.254.169.254/")


def test_an_emulated_machine_that_goes_takes_its_rule_along(monkeypatch, tmp_path):
    """The emulated nodes share the host's kernel: a node that stops (or is killed, or
    terminated by EC2) has the emulator remove its IMDS rule, as its machine's would go."""
    from emulator.nodes import Node, stop_nodes

    removed: list[str] = []
    monkeypatch.setattr(imds_guard, "remove", removed.append)
    inst = loopback_instances(1)[0]
    node = Node(inst, "worker", tmp_path / "n", tmp_path / "efs", tmp_path / "logs")
    node.imds_url = f"http://{inst.address}:41234/"
    assert stop_nodes([node]) == set()
    node.kill([])
    assert removed == [node.imds_url, node.imds_url]
