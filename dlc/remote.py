"""The channel to the master: its own CLIs (``dl-health``, ``dl-jobs``, ``dl-run``,
``dl-scale``) run through SSM Run Command with the cluster's own Command document.

Why Run Command (docs/dlc.md, "The channel"): the nodes already run the SSM Agent (their
role has AmazonSSMManagedInstanceCore, which Session Manager needs anyway), so no inbound
port is opened, no SSH key is handed out, every call is authenticated by IAM and logged in
CloudTrail, and it can be limited to this cluster's instances by their ``dl-cluster:id``
tag. ``SendCommand`` runs the stack's Command document (constructs_lib/operator_document.py:
one of the four commands with validated arguments, ``dl-run`` as a named user; never a
script); ``GetCommandInvocation`` returns its exit code and output once it ends (the first
24,000 characters of stdout, 8,000 of stderr: ``dlc logs`` asks for its output in pages
below that, from a cursor, ``dl-jobs logs ID --cursor C``).

The values are checked here against the document's patterns first, so a refused argument
is a clear usage error rather than SSM's InvalidParameters.
"""

from __future__ import annotations

import json
import re
import shlex
import time
from dataclasses import dataclass

from dlc import aws
from dlc.errors import DlcError, UsageError
from dlc.target import Target

#: SendCommand's delivery timeout (its minimum): an agent that does not take the command
#: within it is not connected.
DELIVERY_TIMEOUT = 30
#: The default bound on one remote command's run time.
DEFAULT_TIMEOUT = 120
#: What GetCommandInvocation returns of stdout at most.
STDOUT_LIMIT = 24_000
#: Exit status of a shell that did not find the command.
NOT_INSTALLED = 127
TERMINAL = ("Success", "Failed", "TimedOut", "Cancelled")
#: The commands the cluster's document runs, and its patterns (the same as
#: constructs_lib/operator_document.py's; tests/cli/test_pure.py holds them together).
COMMANDS = ("dl-run", "dl-jobs", "dl-health", "dl-scale")
ARGUMENT_CHARS = r"A-Za-z0-9_./:=,@%+-"
ARGUMENT_RE = re.compile(rf"^[{ARGUMENT_CHARS}]+$")
USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")


def document_parameters(argv: list[str], *, timeout: int, run_as: str | None = None,
                        offset: int = 0, limit: int = 0,
                        workdir: str | None = None) -> dict[str, str]:
    """The document's parameters for ``argv`` (UsageError naming what it refuses)."""
    if not argv or argv[0] not in COMMANDS:
        raise UsageError(f"the cluster's command document runs {', '.join(COMMANDS)} only, "
                         f"not {argv[:1]}")
    for arg in argv[1:]:
        if not ARGUMENT_RE.match(arg):
            raise UsageError(
                f"argument {arg!r} has characters the cluster's command document refuses "
                f"(allowed: letters, digits and _ . / : = , @ % + -; no spaces, quotes or "
                "shell syntax): put such a command in a script on the shared file system "
                "and submit that, e.g. dlc submit -- bash /efs/home/me/train.sh")
    params = {"command": argv[0], "arguments": " ".join(argv[1:]),
              "executionTimeout": str(timeout)}
    if run_as is not None:
        check_user(run_as)
        params["runAs"] = run_as
    if limit:
        params.update(outputOffset=str(offset), outputLimit=str(limit))
    if workdir is not None:  # <bucket>/workdirs/<user>/<id>.tar.gz (dlc.workdir made it)
        params["workdir"] = workdir
    return params


def check_user(user: str) -> str:
    """A Linux user name jobs may run as: never root (the node also refuses UIDs < 1000)."""
    if not USER_RE.match(user):
        raise UsageError(f"--as {user!r} is not a Linux user name ([a-z_][a-z0-9_-]*, at "
                         "most 32 characters)")
    if user == "root":
        raise UsageError("--as root: jobs never run as root; give a cluster user")
    return user


def user_from_arn(arn: str) -> str:
    """The cluster user an IAM identity maps to: the last component of its ARN (an assumed
    role's session name, an IAM user's name), cut at ``@``, lower-cased, every character
    other than a-z, 0-9, ``_`` and ``-`` replaced by ``_``, prefixed with ``_`` if it
    does not start with a letter or ``_``, at most 32 characters."""
    last = arn.rsplit("/", 1)[-1] if "/" in arn else arn.rsplit(":", 1)[-1]
    name = re.sub(r"[^a-z0-9_-]", "_", last.split("@", 1)[0].lower())
    if not name or not re.match(r"[a-z_]", name):
        name = "_" + name
    return name[:32]


@dataclass
class Result:
    """What a remote command did."""

    code: int
    stdout: str
    stderr: str
    status: str  # Run Command's invocation status

    @property
    def ok(self) -> bool:
        return self.code == 0

    def message(self) -> str:
        """The remote command's own error text (stderr, else stdout), trimmed."""
        return (self.stderr.strip() or self.stdout.strip())[-2000:]


class Remote:
    """Runs commands on one instance (the master) and waits for their result."""

    def __init__(self, target: Target, instance_id: str, *, poll: float = 0.25,
                 document: str | None = None) -> None:
        self.target = target
        self.instance_id = instance_id
        self.poll = poll
        self._document = document

    @property
    def document(self) -> str:
        """The stack's Command document (looked up once)."""
        if self._document is None:
            self._document = aws.operator_document(self.target)
        return self._document

    def run(self, argv: list[str], *, timeout: int = DEFAULT_TIMEOUT,
            run_as: str | None = None, offset: int = 0, limit: int = 0,
            workdir: str | None = None) -> Result:
        """Run ``argv`` on the instance (as ``run_as``; with ``limit``, only bytes
        ``offset`` .. ``offset + limit`` of its output; with ``workdir``, ``dl-run`` gets
        that staged directory); waits for it to end."""
        params = document_parameters(argv, timeout=timeout, run_as=run_as, offset=offset,
                                     limit=limit, workdir=workdir)
        text = shlex.join(argv)
        command_id = aws.send_command(self.target, self.instance_id, self.document, params,
                                      comment=f"dlc: {text}"[:100],
                                      delivery_timeout=DELIVERY_TIMEOUT)
        deadline = time.monotonic() + timeout + DELIVERY_TIMEOUT + 30
        delay = self.poll
        while True:
            inv = aws.command_invocation(self.target, command_id, self.instance_id)
            status = (inv or {}).get("Status", "Pending")
            if status in TERMINAL:
                return self._result(inv or {}, text, timeout)
            if time.monotonic() > deadline:
                raise DlcError(f"no result from {self.instance_id} for '{text}' after "
                               f"{timeout + DELIVERY_TIMEOUT} s (command {command_id}, "
                               f"status {status})")
            time.sleep(delay)
            delay = min(delay * 1.5, 2.0)

    def _result(self, inv: dict, text: str, timeout: int) -> Result:
        status = inv["Status"]
        details = inv.get("StatusDetails", status)
        if status == "TimedOut" and "Delivery" in details:
            raise DlcError(f"the master {self.instance_id} did not take the command within "
                           f"{DELIVERY_TIMEOUT} s ({details}): its SSM Agent is not "
                           "connected. Is the instance running and healthy? (dlc status)")
        if status == "TimedOut":
            raise DlcError(f"'{text}' ran longer than {timeout} s on {self.instance_id} and "
                           "was stopped")
        if status == "Cancelled":
            raise DlcError(f"'{text}' was cancelled on {self.instance_id}")
        return Result(int(inv.get("ResponseCode", 1)), inv.get("StandardOutputContent", ""),
                      inv.get("StandardErrorContent", ""), status)

    def check(self, argv: list[str], *, timeout: int = DEFAULT_TIMEOUT) -> Result:
        """``run``, failing with the remote command's own message when it exits non-zero."""
        res = self.run(argv, timeout=timeout)
        if res.code == NOT_INSTALLED:
            raise DlcError(f"{argv[0]} is not installed on the master {self.instance_id} "
                           f"(exit 127): {res.message()}")
        if not res.ok:
            raise DlcError(f"{shlex.join(argv)} failed on the master (exit {res.code}): "
                           f"{res.message()}")
        return res

    def json(self, argv: list[str], *, timeout: int = DEFAULT_TIMEOUT,
             allow_codes: tuple[int, ...] = (0,), run_as: str | None = None,
             workdir: str | None = None) -> object:
        """Run a command that prints JSON and parse it (``allow_codes``: exit statuses that
        still carry a JSON answer, e.g. dl-health's 1 = unhealthy)."""
        res = self.run(argv, timeout=timeout, run_as=run_as, workdir=workdir)
        if res.code == NOT_INSTALLED:
            raise DlcError(f"{argv[0]} is not installed on the master {self.instance_id} "
                           f"(exit 127): {res.message()}")
        if res.code not in allow_codes:
            raise DlcError(f"{shlex.join(argv)} failed on the master (exit {res.code}): "
                           f"{res.message()}")
        try:
            return json.loads(res.stdout)
        except ValueError:
            raise DlcError(f"{shlex.join(argv)} printed no JSON on the master (exit "
                           f"{res.code}): {res.stdout[:300]!r} {res.message()[:300]}") from None
