"""The SSM Agent of emulated nodes: Run Command's ``AWS-RunShellScript`` and the account's
own shell Command documents (the cluster's ``OperatorDocument``) really run.

On EC2 the SSM Agent on each instance registers the instance with Systems Manager and polls
it for commands; ``SendCommand`` with the ``AWS-RunShellScript`` document makes the agent
write the ``commands`` parameter to a script, run it as root, and report the exit code,
stdout and stderr, which ``GetCommandInvocation`` returns
(https://docs.aws.amazon.com/systems-manager/latest/userguide/run-command.html,
https://docs.aws.amazon.com/systems-manager/latest/APIReference/API_GetCommandInvocation.html).
moto 5.2 records ``SendCommand`` and answers every invocation "Success" with empty output,
running nothing. Inside the emulator's moto server process (``emulator.cloud``), this module
plays the agent:

- An emulated node's boot announces its machine (:func:`announce`, from ``emulator.nodes``):
  instance id, root directory, environment (its AWS settings and metadata endpoint) and
  process group. That is the agent registering its instance. The announcement goes to moto's
  own configuration API (``POST /moto-api/static/ssm/agents``, beside moto's other
  ``/moto-api/static/...`` switches), so it reaches the server whichever process booted the
  node, and stays there after ``make demo ARGS=--keep`` exits.
- ``SendCommand`` (``AWS-RunShellScript``) to an announced instance runs the commands with
  ``sh`` in the node's environment, as the node's root user would: ``DL_ROOT`` is the node's
  root (on EC2 the root is ``/``), its installed wrappers (``<root>/usr/local/bin``) are
  first on ``PATH``, the working directory is the agent's per-command orchestration
  directory under the node's root (or ``workingDirectory``). The invocation is
  ``InProgress`` with empty output while it runs (as documented: output appears once the
  plugin finished), then ``Success`` / ``Failed`` with ``ResponseCode`` and the first 24,000
  characters of stdout and 8,000 of stderr; ``executionTimeout`` (default 3600 s) ends it
  as ``TimedOut``.
- An instance no agent announced answers ``InvalidInstanceId`` (as SSM does for instances
  that are not managed nodes). A node whose processes are all gone (the machine died) has no
  agent to take the command: the invocation stays ``Pending`` until the agent is back (it is
  then delivered, as the SSM Agent picks up pending commands when it reconnects) or, after
  the command's ``TimeoutSeconds``, ends ``TimedOut`` with status details "Delivery Timed
  Out".

- A Command document of the account (``CreateDocument`` / CloudFormation's
  ``AWS::SSM::Document``) whose one step is ``aws:runShellScript`` runs the way the agent runs
  it: SendCommand first checks the parameters against the document as Systems Manager does
  and refuses the command with ``InvalidParameters`` (nothing is delivered) for a parameter
  the document does not declare, a missing one without a default, more than one value for
  a ``String``, or a value that does not match its ``allowedPattern`` (a regular-expression
  search, as the ``^…$`` anchors of AWS's examples imply) or is not among its
  ``allowedValues``; defaults fill the rest. The step's ``runCommand`` lines then run with
  every ``{{ name }}`` replaced by the value, each parameter with ``interpolationType:
  ENV_VAR`` also in the environment as ``SSM_<name>`` (SSM Agent 3.3.2746.0 and later), and
  the step's ``timeoutSeconds`` as the execution timeout; the invocation's ``PluginName`` is
  the step's name
  (https://docs.aws.amazon.com/systems-manager/latest/userguide/documents-syntax-data-elements-parameters.html,
  https://docs.aws.amazon.com/systems-manager/latest/APIReference/API_SendCommand.html).

Other documents keep moto's behaviour (recorded, nothing runs). Running commands are killed
when the server exits.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bootstrap_scripts.node.procgroup import pids_in_groups
from emulator.ssm_documents import (
    DEFAULT_EXECUTION_TIMEOUT,
    PLUGIN,
    Plan,
    command_document,
    document_plan,
    resolve_parameters,
)

#: Where a node's announcement goes on moto's server.
ANNOUNCE_PATH = "/moto-api/static/ssm/agents"
RUN_SHELL_SCRIPT = "AWS-RunShellScript"
#: GetCommandInvocation returns at most this much of stdout / stderr.
STDOUT_LIMIT = 24_000
STDERR_LIMIT = 8_000
#: The node's installed command wrappers, under its root.
BIN_DIR = "usr/local/bin"

_LOCK = threading.RLock()
_AGENTS: dict[str, Agent] = {}
_RUNNING: dict[int, subprocess.Popen] = {}  # pid -> process (its own process group)
_INSTALLED = False


class AgentError(RuntimeError):
    """A node could not announce its agent; the message says to what and why."""


@dataclass
class Agent:
    """One announced instance: where its machine lives and how its processes run."""

    instance_id: str
    root: str
    env: dict[str, str]
    pgid: int  # the node's process group: none alive = the machine is gone
    announced: float = field(default_factory=time.time)

    def alive(self) -> bool:
        return bool(self.pgid) and bool(pids_in_groups([self.pgid]))

    def command_env(self) -> dict[str, str]:
        env = dict(self.env)
        env["DL_ROOT"] = self.root
        env["PATH"] = f"{Path(self.root) / BIN_DIR}{os.pathsep}{env.get('PATH', '')}"
        env.setdefault("HOME", "/root")
        return env


# -- the node side --------------------------------------------------------------------------


def announce(env: dict[str, str], instance_id: str, root: Path | str, pgid: int) -> None:
    """The node's agent registers with the emulator's Systems Manager (moto's server at the
    node's ``AWS_ENDPOINT_URL``). A node without AWS settings has no agent to announce."""
    endpoint = env.get("AWS_ENDPOINT_URL", "")
    if not endpoint:
        return
    body = json.dumps({"instance_id": instance_id, "root": str(root), "env": env,
                       "pgid": pgid}).encode()
    req = urllib.request.Request(endpoint.rstrip("/") + ANNOUNCE_PATH, data=body,
                                 method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            resp.read()
    except (urllib.error.URLError, OSError) as exc:
        raise AgentError(f"node {instance_id}: its SSM agent could not register with "
                         f"{endpoint}{ANNOUNCE_PATH}: {exc} (is that the emulator's moto "
                         "server, with emulator.moto_extensions installed?)") from None


# -- the server side ------------------------------------------------------------------------


def register(instance_id: str, root: str, env: dict[str, str], pgid: int) -> Agent:
    agent = Agent(instance_id, root, {str(k): str(v) for k, v in env.items()}, int(pgid))
    with _LOCK:
        _AGENTS[instance_id] = agent
    return agent


def agents() -> dict[str, Agent]:
    with _LOCK:
        return dict(_AGENTS)


def reset() -> None:
    """Forget every agent (with moto's reset); commands still running are stopped."""
    stop_running()
    with _LOCK:
        _AGENTS.clear()
        _PLANS.clear()


def stop_running() -> None:
    with _LOCK:
        running = list(_RUNNING.values())
    for proc in running:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


def _announce_view(request: Any, full_url: str, headers: Any) -> tuple[int, dict, str]:
    """moto's view for ``POST /moto-api/static/ssm/agents`` (``GET`` lists the agents)."""
    if request.method == "GET":
        listing = {iid: {"root": a.root, "pgid": a.pgid, "alive": a.alive()}
                   for iid, a in agents().items()}
        return 200, {"Content-Type": "application/json"}, json.dumps(listing)
    try:
        data = json.loads(request.data or b"{}")
        agent = register(str(data["instance_id"]), str(data["root"]), dict(data["env"]),
                         int(data.get("pgid") or 0))
    except (KeyError, TypeError, ValueError) as exc:
        return 400, {"Content-Type": "application/json"}, json.dumps({"error": str(exc)})
    return 200, {"Content-Type": "application/json"}, json.dumps(
        {"instance_id": agent.instance_id})


def _invalid_instance(ids: list[str], account: str) -> Exception:
    from moto.ssm.exceptions import SSMException

    class InvalidInstanceId(SSMException):
        def __init__(self) -> None:
            super().__init__("InvalidInstanceId", f"Instances {ids} not in a valid state "
                             f"for account {account}: no SSM Agent registered for them")

    return InvalidInstanceId()


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _param(parameters: dict, name: str, default: str) -> str:
    value = parameters.get(name) or [default]
    return str(value[0] if isinstance(value, list) else value)


def _finish(command: Any, invocation: dict, *, status: str, details: str, code: int,
            out: str = "", err: str = "") -> None:
    end = _now()
    with _LOCK:
        invocation.update({
            "Status": status, "StatusDetails": details, "ResponseCode": code,
            "StandardOutputContent": out[:STDOUT_LIMIT],
            "StandardErrorContent": err[:STDERR_LIMIT],
            "ExecutionEndDateTime": end.isoformat(),
        })
        states = {i["Status"] for i in command.invocations}
        if not states & {"Pending", "InProgress"}:
            command.status = "Success" if states == {"Success"} else "Failed"
            command.status_details = command.status
        command.completed_count = sum(i["Status"] not in ("Pending", "InProgress")
                                      for i in command.invocations)
        command.error_count = sum(i["Status"] in ("Failed", "TimedOut")
                                  for i in command.invocations)


def _run(command: Any, invocation: dict, agent: Agent, plan: Plan) -> None:
    """Run the script on the node; fill the invocation in when it ends."""
    params = command.parameters or {}
    step_dir = re.sub(r"[^A-Za-z0-9_.-]", "", plan.plugin)
    orchestration = (Path(agent.root) / "var/lib/amazon/ssm" / agent.instance_id / "document"
                     / "orchestration" / command.command_id / step_dir / f"0.{step_dir}")
    try:
        orchestration.mkdir(parents=True, exist_ok=True)
        script = orchestration / "_script.sh"
        script.write_text("\n".join(str(x) for x in plan.lines) + "\n")
        cwd = _param(params, "workingDirectory", "") if plan.plugin == PLUGIN else ""
        proc = subprocess.Popen(["sh", str(script)], cwd=cwd or str(orchestration),
                                env={**agent.command_env(), **plan.env},
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
    except OSError as exc:
        _finish(command, invocation, status="Failed", details="Failed", code=1,
                err=f"failed to run commands: {exc}")
        return
    timeout = plan.timeout
    with _LOCK:
        _RUNNING[proc.pid] = proc
    try:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            _finish(command, invocation, status="TimedOut", details="Execution Timed Out",
                    code=-1, out=out.decode(errors="replace"),
                    err=err.decode(errors="replace"))
            return
    finally:
        with _LOCK:
            _RUNNING.pop(proc.pid, None)
    code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
    _finish(command, invocation, status="Success" if code == 0 else "Failed",
            details="Success" if code == 0 else "Failed", code=code,
            out=out.decode(errors="replace"), err=err.decode(errors="replace"))


#: The plan of each command with an undelivered invocation, by command id.
_PLANS: dict[str, Plan] = {}


def _deliver(command: Any, plan: Plan, *, pending_only: bool = False) -> None:
    """Hand each invocation of a new command to its instance's agent (``pending_only``:
    those still waiting for theirs, now that it may be back)."""
    start = _now()
    for invocation in command.invocations:
        if pending_only and invocation.get("Status") != "Pending":
            continue
        agent = agents().get(invocation["InstanceId"])
        with _LOCK:
            invocation.update({"ResponseCode": -1, "StandardOutputContent": "",
                               "StandardErrorContent": "", "ExecutionEndDateTime": "",
                               "ExecutionElapsedTime": "", "PluginName": plan.plugin})
            if agent is None or not agent.alive():
                _PLANS[command.command_id] = plan
                invocation.update({"Status": "Pending", "StatusDetails": "Pending",
                                   "ExecutionStartDateTime": ""})
                continue
            invocation.update({"Status": "InProgress", "StatusDetails": "InProgress",
                               "ExecutionStartDateTime": start.isoformat()})
        threading.Thread(target=_run, args=(command, invocation, agent, plan), daemon=True,
                         name=f"ssm-{command.command_id[:8]}").start()
    with _LOCK:
        if not any(i.get("Status") == "Pending" for i in command.invocations):
            _PLANS.pop(command.command_id, None)
        if not pending_only:
            command.status = command.status_details = "InProgress"
            command.completed_count = 0


def _expire_undelivered(command: Any) -> None:
    """A command no agent took within its ``TimeoutSeconds`` times out undelivered."""
    deadline = command.requested_date_time + datetime.timedelta(
        seconds=command.timeout_seconds)
    now = _now() if deadline.tzinfo else _now().replace(tzinfo=None)  # moto's clock is naive
    if now < deadline:
        plan = _PLANS.get(command.command_id)
        if plan is not None:  # an agent that was away takes its pending invocation now
            _deliver(command, plan, pending_only=True)
        return
    _PLANS.pop(command.command_id, None)
    for invocation in command.invocations:
        if invocation["Status"] == "Pending":
            _finish(command, invocation, status="TimedOut", details="Delivery Timed Out",
                    code=-1)


def _shell_script_plan(parameters: dict) -> Plan:
    lines = parameters.get("commands") or []
    if isinstance(lines, str):
        lines = [lines]
    timeout = float(_param(parameters, "executionTimeout", str(DEFAULT_EXECUTION_TIMEOUT)))
    return Plan([str(x) for x in lines], {}, timeout, PLUGIN)


def _wrap_send_command(original: Any) -> Any:
    def send_command(self: Any, **kwargs: Any) -> Any:
        name = kwargs.get("document_name")
        if name == RUN_SHELL_SCRIPT:
            plan = _shell_script_plan(kwargs.get("parameters") or {})
        elif name and not name.startswith("AWS-"):
            content = command_document(self, name)
            if content is None:
                return original(self, **kwargs)
            plan = document_plan(content,
                                 resolve_parameters(content, kwargs.get("parameters") or {}))
        else:
            return original(self, **kwargs)
        requested = list(kwargs.get("instance_ids") or [])
        unknown = [i for i in requested if i not in agents()]
        if unknown:
            raise _invalid_instance(unknown, self.account_id)
        command = original(self, **kwargs)
        if not kwargs.get("targets"):
            # moto 5.2 adds every EC2 instance when no Targets are given; SendCommand with
            # InstanceIds reaches exactly those instances.
            command.instance_ids = requested
            command.invocations = [i for i in command.invocations
                                   if i["InstanceId"] in requested]
            command.target_count = len(requested)
        _deliver(command, plan)
        return command

    return send_command


def _wrap_get_command_invocation(original: Any) -> Any:
    def get_command_invocation(self: Any, command_id: str, instance_id: str,
                               plugin_name: str | None) -> dict[str, Any]:
        command = self.get_command_by_id(command_id)
        if any("PluginName" in i for i in command.invocations):  # delivered by this agent
            _expire_undelivered(command)
        with _LOCK:
            return dict(original(self, command_id, instance_id, plugin_name))

    return get_command_invocation


def install() -> None:
    """Patch moto's SSM backend and add the announce route (before the server serves)."""
    global _INSTALLED
    if _INSTALLED:
        return
    from moto.moto_api._internal import urls as moto_api_urls
    from moto.ssm.models import SimpleSystemManagerBackend

    moto_api_urls.url_paths["{0}" + ANNOUNCE_PATH] = _announce_view
    SimpleSystemManagerBackend.send_command = _wrap_send_command(  # type: ignore[method-assign]
        SimpleSystemManagerBackend.send_command)
    SimpleSystemManagerBackend.get_command_invocation = (  # type: ignore[method-assign]
        _wrap_get_command_invocation(SimpleSystemManagerBackend.get_command_invocation))
    atexit.register(stop_running)
    _INSTALLED = True
