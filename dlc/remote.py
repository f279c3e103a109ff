"""The channel to the master: its own CLIs (``dl-health``, ``dl-jobs``, ``dl-run``,
``dl-scale``) run through SSM Run Command.

Why Run Command (docs/dlc.md, "The channel"): the nodes already run the SSM Agent (their
role has AmazonSSMManagedInstanceCore, which Session Manager needs anyway), so no inbound
port is opened, no SSH key is handed out, every call is authenticated by IAM and logged in
CloudTrail, and it can be limited to this cluster's instances by their ``dl-cluster:id``
tag. ``SendCommand`` runs a shell script as root with the ``AWS-RunShellScript`` document;
``GetCommandInvocation`` returns its exit code and output once it ends (the first 24,000
characters of stdout, 8,000 of stderr: callers that may print more read it in chunks).
"""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass

from dlc import aws
from dlc.errors import DlcError
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

    def __init__(self, target: Target, instance_id: str, *, poll: float = 0.25) -> None:
        self.target = target
        self.instance_id = instance_id
        self.poll = poll

    def run(self, argv: list[str], *, timeout: int = DEFAULT_TIMEOUT,
            script: str | None = None) -> Result:
        """Run ``argv`` (or a ready ``script``) on the instance; waits for it to end."""
        text = script if script is not None else shlex.join(argv)
        command_id = aws.send_command(self.target, self.instance_id, text,
                                      comment=f"dlc: {text}"[:100],
                                      execution_timeout=timeout,
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
             allow_codes: tuple[int, ...] = (0,)) -> object:
        """Run a command that prints JSON and parse it (``allow_codes``: exit statuses that
        still carry a JSON answer, e.g. dl-health's 1 = unhealthy)."""
        res = self.run(argv, timeout=timeout)
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

    def read_chunked(self, argv: list[str], *, offset: int = 0,
                     timeout: int = DEFAULT_TIMEOUT, chunk: int = 16_000) -> tuple[str, int]:
        """The output of ``argv`` from byte ``offset`` on, read in chunks below Run
        Command's output limit; returns (text, new offset). The command's exit status is
        checked on every chunk."""
        out: list[str] = []
        while True:
            script = chunk_script(argv, offset, chunk)
            res = self.run(argv, timeout=timeout, script=script)
            if res.code == NOT_INSTALLED:
                raise DlcError(f"{argv[0]} is not installed on the master "
                               f"{self.instance_id} (exit 127): {res.message()}")
            if not res.ok:
                raise DlcError(f"{shlex.join(argv)} failed on the master (exit {res.code}): "
                               f"{res.message()}")
            data = res.stdout.encode()
            out.append(res.stdout)
            offset += len(data)
            if len(data) < chunk:
                return "".join(out), offset


def chunk_script(argv: list[str], offset: int, size: int) -> str:
    """A POSIX sh script: run ``argv`` into a temp file, keep its exit status, print bytes
    ``offset`` .. ``offset + size`` of its output, exit with its status."""
    return (f'f=$(mktemp) || exit 1\n{shlex.join(argv)} > "$f"\nrc=$?\n'
            f'tail -c +{offset + 1} "$f" | head -c {size}\nrm -f "$f"\nexit $rc\n')
