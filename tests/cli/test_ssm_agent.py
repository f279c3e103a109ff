"""The emulator's SSM Agent (emulator/ssm_agent.py) over moto's real HTTP server: Run
Command runs the script on the announced node with the node's environment, and
GetCommandInvocation answers as AWS documents (InProgress with no output while it runs,
then the exit code and output; InvalidInstanceId for an unmanaged instance; an agent that
is gone never takes the command). The cluster's own Command document runs as the agent runs
it: SendCommand refuses parameters that fail its patterns (InvalidParameters), and its
script runs only the dl-* commands, dl-run as a named user and never root."""

from __future__ import annotations

import datetime
import getpass
import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from botocore.exceptions import ClientError

from constructs_lib.operator_document import (
    COMMANDS,
    STEP_NAME,
    document_content,
    user_document_name,
)
from emulator import ssm_agent
from tests.support.users import CAN_CREATE_USERS, cluster_user, reachable

IID = "i-0123456789abcdef0"


@pytest.fixture()
def machine(moto_reset: str, tmp_path: Path) -> Iterator[tuple[str, Path, subprocess.Popen]]:
    """An announced node: a root with one installed wrapper, and a process group standing for
    the machine (stopped at teardown)."""
    root = tmp_path / "node"
    (root / "usr/local/bin").mkdir(parents=True)
    tool = root / "usr/local/bin/dl-hello"
    tool.write_text('#!/bin/sh\necho "hello from $DL_ROOT as $(id -un)"\n')
    tool.chmod(0o755)
    proc = subprocess.Popen(["sleep", "600"], process_group=0)
    ssm_agent.announce({"AWS_ENDPOINT_URL": moto_reset, "PATH": "/usr/bin:/bin",
                        "NODE_VAR": "x"}, IID, root, proc.pid)
    try:
        yield moto_reset, root, proc
    finally:
        proc.kill()
        proc.wait()


def ssm(endpoint: str):
    return boto3.client("ssm", endpoint_url=endpoint, region_name="us-east-1")


def send(endpoint: str, *lines: str, timeout: str = "60", delivery: int = 30) -> str:
    res = ssm(endpoint).send_command(
        InstanceIds=[IID], DocumentName="AWS-RunShellScript", TimeoutSeconds=delivery,
        Parameters={"commands": list(lines), "executionTimeout": [timeout]})
    return res["Command"]["CommandId"]


def wait_done(endpoint: str, command_id: str, instance_id: str = IID) -> dict:
    client = ssm(endpoint)
    for _ in range(600):
        inv = client.get_command_invocation(CommandId=command_id, InstanceId=instance_id)
        if inv["Status"] not in ("Pending", "InProgress"):
            return inv
        time.sleep(0.1)
    raise AssertionError(f"command {command_id} never ended: {inv}")


def test_script_runs_on_the_node_with_its_environment(machine) -> None:
    endpoint, root, _ = machine
    cid = send(endpoint, "dl-hello", 'echo "var=$NODE_VAR cwd=$(pwd)"', "echo oops >&2",
               "exit 3")
    inv = wait_done(endpoint, cid)
    assert inv["Status"] == "Failed" and inv["ResponseCode"] == 3
    out = inv["StandardOutputContent"]
    assert f"hello from {root} as " in out  # the node's wrapper, DL_ROOT = its root
    assert "var=x" in out and f"cwd={root}/var/lib/amazon/ssm/{IID}/document" in out
    assert inv["StandardErrorContent"] == "oops\n"
    ok = wait_done(endpoint, send(endpoint, "true"))
    assert (ok["Status"], ok["ResponseCode"]) == ("Success", 0)


def test_in_progress_has_no_output_until_it_ends(machine, tmp_path: Path) -> None:
    endpoint, _, _ = machine
    gate = tmp_path / "gate"
    cid = send(endpoint, "echo started", f"while [ ! -e {gate} ]; do sleep 0.05; done",
               "echo done")
    inv = ssm(endpoint).get_command_invocation(CommandId=cid, InstanceId=IID)
    assert inv["Status"] == "InProgress" and inv["StandardOutputContent"] == ""
    gate.touch()
    inv = wait_done(endpoint, cid)
    assert (inv["Status"], inv["StandardOutputContent"]) == ("Success", "started\ndone\n")


def test_output_is_cut_where_aws_cuts_it(machine) -> None:
    endpoint, _, _ = machine
    inv = wait_done(endpoint, send(endpoint, "head -c 30000 /dev/zero | tr '\\0' a"))
    assert len(inv["StandardOutputContent"]) == ssm_agent.STDOUT_LIMIT


def test_execution_timeout_stops_the_script(machine) -> None:
    endpoint, _, _ = machine
    inv = wait_done(endpoint, send(endpoint, "sleep 30", timeout="1"))
    assert (inv["Status"], inv["StatusDetails"]) == ("TimedOut", "Execution Timed Out")


def test_only_the_named_instance_gets_the_command(machine) -> None:
    """moto alone would add every EC2 instance to a command without Targets."""
    endpoint, _, _ = machine
    ec2 = boto3.client("ec2", endpoint_url=endpoint, region_name="us-east-1")
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    ec2.run_instances(ImageId=image, MinCount=2, MaxCount=2)
    cid = send(endpoint, "true")
    listed = ssm(endpoint).list_commands(CommandId=cid)["Commands"][0]
    assert listed["InstanceIds"] == [IID]


def test_unmanaged_instance_is_refused(machine) -> None:
    endpoint, _, _ = machine
    with pytest.raises(ClientError) as exc:
        ssm(endpoint).send_command(InstanceIds=["i-00000000000000000"],
                                   DocumentName="AWS-RunShellScript",
                                   Parameters={"commands": ["true"]})
    assert exc.value.response["Error"]["Code"] == "InvalidInstanceId"


def test_a_dead_machine_never_takes_the_command(machine, emulator_cloud) -> None:
    endpoint, _, proc = machine
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    cid = send(endpoint, "true")
    inv = ssm(endpoint).get_command_invocation(CommandId=cid, InstanceId=IID)
    assert inv["Status"] == "Pending"
    # The delivery timeout passes (moved back on moto's own record, not waited for).
    from moto.ssm.models import ssm_backends

    command = ssm_backends["123456789012"]["us-east-1"].get_command_by_id(cid)
    command.requested_date_time -= datetime.timedelta(seconds=31)
    inv = ssm(endpoint).get_command_invocation(CommandId=cid, InstanceId=IID)
    assert (inv["Status"], inv["StatusDetails"]) == ("TimedOut", "Delivery Timed Out")



def test_a_machine_back_before_the_delivery_timeout_takes_its_pending_command(
        machine) -> None:
    """The SSM Agent picks up a command that was pending while it was away."""
    endpoint, root, proc = machine
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    cid = send(endpoint, "dl-hello")
    assert ssm(endpoint).get_command_invocation(
        CommandId=cid, InstanceId=IID)["Status"] == "Pending"
    back = subprocess.Popen(["sleep", "600"], process_group=0)
    try:
        ssm_agent.announce({"AWS_ENDPOINT_URL": endpoint, "PATH": "/usr/bin:/bin"}, IID,
                           root, back.pid)
        inv = wait_done(endpoint, cid)
        assert inv["Status"] == "Success", inv
        assert inv["StandardOutputContent"].startswith(f"hello from {root}")
    finally:
        back.kill()
        back.wait()

# -- the cluster's own Command document (constructs_lib/operator_document.py) ---------------


@pytest.fixture()
def cluster_document(machine) -> tuple[str, Path, str]:
    """The machine with dl-* wrappers that print who runs them and their arguments, and
    the cluster's document created in the account (as CloudFormation would)."""
    endpoint, root, _ = machine
    for name in COMMANDS:
        tool = root / "usr/local/bin" / name
        tool.write_text(f'#!/bin/sh\necho "{name} as $(id -un) home=$HOME n=$#"\n'
                        'for a in "$@"; do echo "arg=$a"; done\nexit "${DL_EXIT:-0}"\n')
        tool.chmod(0o755)
    name = ssm(endpoint).create_document(
        Content=json.dumps(document_content()), Name="DlClusterOperate",
        DocumentType="Command", DocumentFormat="JSON")["DocumentDescription"]["Name"]
    return endpoint, root, name


def run_doc(endpoint: str, document: str, **params: str) -> dict:
    res = ssm(endpoint).send_command(InstanceIds=[IID], DocumentName=document,
                                     Parameters={k: [v] for k, v in params.items()})
    return wait_done(endpoint, res["Command"]["CommandId"])


def test_the_document_runs_only_its_commands_with_literal_arguments(cluster_document) -> None:
    endpoint, _, doc = cluster_document
    inv = run_doc(endpoint, doc, command="dl-health", arguments="--json  --deep")
    assert (inv["Status"], inv["PluginName"]) == ("Success", STEP_NAME)
    assert inv["StandardOutputContent"].splitlines() == [
        f"dl-health as {getpass.getuser()} home=/root n=2", "arg=--json", "arg=--deep"]
    # what would be a glob in a shell reaches no shell: the pattern refuses it before
    for bad in ({"command": "sh"}, {"command": "dl-health; id"},
                {"command": "dl-jobs", "arguments": "x;id"},
                {"command": "dl-jobs", "arguments": "$(id)"},
                {"command": "dl-jobs", "arguments": "*"},
                {"command": "dl-run", "runAs": "Alice Smith"},
                {"command": "dl-jobs", "outputLimit": "-1"},
                {"command": "dl-jobs", "commands": "id"}):
        with pytest.raises(ClientError) as exc:
            ssm(endpoint).send_command(InstanceIds=[IID], DocumentName=doc,
                                       Parameters={k: [v] for k, v in bad.items()})
        assert exc.value.response["Error"]["Code"] == "InvalidParameters", bad
    assert len(ssm(endpoint).list_commands()["Commands"]) == 1  # nothing refused was sent


def test_the_document_reads_output_in_pieces_and_keeps_the_exit_status(
        cluster_document) -> None:
    endpoint, _, doc = cluster_document
    inv = run_doc(endpoint, doc, command="dl-jobs", arguments="logs j-1",
                  outputOffset="5", outputLimit="8")
    assert inv["StandardOutputContent"] == "bs as ro"  # bytes 5..12 of "dl-jobs as root"
    assert inv["ResponseCode"] == 0


def test_dl_run_needs_a_user_and_never_runs_as_root(cluster_document) -> None:
    endpoint, _, doc = cluster_document
    inv = run_doc(endpoint, doc, command="dl-run", arguments="--detach -- true")
    assert inv["ResponseCode"] == 2 and "dl-run needs runAs" in inv["StandardErrorContent"]
    for system_user in ("root", "daemon"):
        inv = run_doc(endpoint, doc, command="dl-run", runAs=system_user)
        assert inv["ResponseCode"] == 2, inv
        assert "root or a system user" in inv["StandardErrorContent"]
    inv = run_doc(endpoint, doc, command="dl-run", runAs="nosuchuser")
    assert inv["ResponseCode"] == 3 and "no user nosuchuser" in inv["StandardErrorContent"]


@pytest.mark.skipif(not CAN_CREATE_USERS, reason="creating a user needs root")
def test_dl_run_runs_as_the_named_user(cluster_document) -> None:
    endpoint, root, doc = cluster_document
    with cluster_user() as user, reachable(root / "usr/local/bin/dl-run"):
        inv = run_doc(endpoint, doc, command="dl-run", runAs=user.pw_name,
                      arguments="--detach --json -- python -m x")
        assert inv["Status"] == "Success", (inv["StandardErrorContent"], inv["ResponseCode"])
        lines = inv["StandardOutputContent"].splitlines()
        assert lines[0] == f"dl-run as {user.pw_name} home={user.pw_dir} n=6"



@pytest.mark.skipif(not CAN_CREATE_USERS, reason="creating a user needs root")
def test_dl_run_arguments_are_not_on_the_root_parents_command_line(cluster_document) -> None:
    """``runuser`` (root) waits for dl-run for the job's whole life, and every user of the
    node reads its ``/proc/<pid>/cmdline``: the arguments (a ``--env`` value among them)
    reach dl-run through the user's own shell, never on runuser's command line."""
    endpoint, root, doc = cluster_document
    tool = root / "usr/local/bin/dl-run"
    tool.write_text('#!/bin/sh\necho "parent=$(tr \'\\0\' \' \' < /proc/$PPID/cmdline)"\n'
                    'for a in "$@"; do echo "arg=$a"; done\n')
    tool.chmod(0o755)
    with cluster_user() as user, reachable(tool):
        inv = run_doc(endpoint, doc, command="dl-run", runAs=user.pw_name,
                      arguments="--env DB_PASSWORD=s3cret-x1  --detach -- true")
        assert inv["Status"] == "Success", (inv["StandardErrorContent"], inv["ResponseCode"])
        lines = inv["StandardOutputContent"].splitlines()
        assert lines[0].startswith("parent=") and "runuser" in lines[0], lines
        assert "s3cret-x1" not in lines[0], lines
        assert lines[1:] == ["arg=--env", "arg=DB_PASSWORD=s3cret-x1", "arg=--detach",
                             "arg=--", "arg=true"]

def test_an_agent_without_environment_parameters_refuses(tmp_path: Path) -> None:
    """An SSM Agent older than 3.3.2746.0 sets no SSM_<name>: the script has no fallback."""
    script = tmp_path / "s.sh"
    script.write_text("\n".join(document_content()["mainSteps"][0]["inputs"]["runCommand"]))
    res = subprocess.run(["sh", str(script)], capture_output=True, text=True, env={
        "PATH": "/usr/bin:/bin"}, timeout=30)
    assert res.returncode == 2 and "does not pass parameters" in res.stderr


# -- a cluster user's own document (``clusterUsers``: the user fixed in the script) ----------


@pytest.mark.skipif(not CAN_CREATE_USERS, reason="creating a user needs root")
def test_a_users_document_runs_dl_run_as_its_user_only_and_takes_no_run_as(machine) -> None:
    """The emulated agent runs a per-user document as it runs the any-user one: no
    ``runAs`` parameter (SendCommand refuses it: InvalidParameters), ``dl-run`` as the
    document's user, the other commands as root with DL_OPERATOR_USER set for dl-jobs."""
    endpoint, root, _ = machine
    for name in COMMANDS:
        tool = root / "usr/local/bin" / name
        tool.write_text(f'#!/bin/sh\necho "{name} as $(id -un) op=${{DL_OPERATOR_USER:-}}"\n'
                        'for a in "$@"; do echo "arg=$a"; done\n')
        tool.chmod(0o755)
    with cluster_user() as user, reachable(root / "usr/local/bin/dl-run"):
        doc = ssm(endpoint).create_document(
            Content=json.dumps(document_content(user.pw_name)),
            Name=user_document_name("c-1", user.pw_name), DocumentType="Command",
            DocumentFormat="JSON")["DocumentDescription"]["Name"]
        for bad in ({"command": "dl-run", "runAs": "root"},
                    {"command": "dl-run", "runAs": user.pw_name}):
            with pytest.raises(ClientError) as exc:
                ssm(endpoint).send_command(InstanceIds=[IID], DocumentName=doc,
                                           Parameters={k: [v] for k, v in bad.items()})
            assert exc.value.response["Error"]["Code"] == "InvalidParameters", bad
        inv = run_doc(endpoint, doc, command="dl-run", arguments="--detach -- true")
        assert inv["Status"] == "Success", inv["StandardErrorContent"]
        assert inv["StandardOutputContent"].splitlines()[0] == f"dl-run as {user.pw_name} op="
        inv = run_doc(endpoint, doc, command="dl-jobs", arguments="cancel j-1")
        assert inv["StandardOutputContent"].splitlines() == [
            f"dl-jobs as {getpass.getuser()} op={user.pw_name}", "arg=cancel", "arg=j-1"]
        inv = run_doc(endpoint, doc, command="dl-run", workdir=f"bkt/workdirs/other/{'0' * 32}"
                      ".tar.gz")
        assert inv["ResponseCode"] == 2 and f"not under workdirs/{user.pw_name}/" in \
            inv["StandardErrorContent"]
