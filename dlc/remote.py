"""The channel to the master: its own CLIs (``dl-health``, ``dl-jobs``, ``dl-run``,
``dl-scale``) run through SSM Run Command with the cluster's own Command document.

Why Run Command (docs/dlc.md, "The channel"): the nodes already run the SSM Agent (their
role has AmazonSSMManagedInstanceCore, which Session Manager needs anyway), so no inbound
port is opened, no SSH key is handed out, every call is authenticated by IAM and logged in
CloudTrail, and it can be limited to this cluster's instances by their ``dl-cluster:id``
tag. ``SendCommand`` runs one of the stack's Command documents
(constructs_lib/operator_document.py: one of the four commands with validated arguments,
``dl-run`` as the document's user; never a script); ``GetCommandInvocation`` returns its
exit code and output once it ends (the first 24,000 characters of stdout, 8,000 of
stderr: ``dlc logs`` asks for its output in pages below that, from a cursor,
``dl-jobs logs ID --cursor C``).

Which document (:func:`choose_document`): the per-user document of the caller's cluster
user (``dl-op.<cluster id>.<user>``), the only kind the operator policy runs, and only the
one its caller's ``dl-user`` principal tag names; the any-user document (``runAs``, the admin
policy's) when the stack has no document for that user. The user is ``--as``, else the
caller's ``dl-user`` tag when IAM lets dlc read it, else the name mapped from the caller's
ARN (:func:`user_from_arn`). dlc only chooses which document to try: IAM decides, and a
refusal names the user and the tag the caller would need (:func:`access_denied`).

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
from dlc.errors import AwsError, DlcError, NotFound, UsageError, listing
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
#: Per-user documents' names start with this (``dl-op.<cluster id>.<user>``), and the
#: principal tag that names an operator's user (constructs_lib/operator_document.py and
#: operator_access.py; tests/cli/test_pure.py holds them together).
USER_DOCUMENT_PREFIX = "dl-op."
USER_TAG = "dl-user"
ACCESS_DENIED = ("AccessDenied", "AccessDeniedException")


def document_user(name: str) -> str | None:
    """The user of a per-user document's name; None for the any-user document."""
    if not name.startswith(USER_DOCUMENT_PREFIX) or "." not in name[len(USER_DOCUMENT_PREFIX):]:
        return None
    return name.rpartition(".")[2] or None


def choose_document(documents: list[str], user: str) -> str:
    """``user``'s per-user document if the stack has one, else the any-user document (the
    admin policy's), else NotFound naming the users that have one."""
    for name in documents:
        if document_user(name) == user:
            return name
    anyone = [d for d in documents if document_user(d) is None]
    if len(anyone) == 1:
        return anyone[0]
    users = sorted(u for u in map(document_user, documents) if u)
    raise NotFound(f"the stack has no Command document for the cluster user {user} (users "
                   f"with one: {listing(users)}; clusterUsers lists them) and "
                   f"{len(anyone)} any-user documents: was it deployed from this version? "
                   "(dlc up)")


def access_denied(document: str, user: str) -> str:
    """What to do when IAM refused SendCommand with ``document`` (run for ``user``)."""
    if document_user(document) is not None:
        return (f"IAM refused to run {document}, the Command document of the cluster user "
                f"{user}: the operator policy (OperatorPolicyArn) runs only the document of "
                f"your own cluster user, named by your IAM identity's {USER_TAG} tag; acting "
                f"as {user} needs the tag {USER_TAG}={user} on your IAM user or role (or as "
                "a session tag), set by an administrator; dlc submit --as USER picks "
                "another user's document, which IAM refuses likewise")
    if not user:
        return (f"IAM refused to run {document}, the any-user Command document (the admin "
                "policy's, AdminSessionPolicyArn): your IAM identity names no cluster user; an "
                f"operator needs the tag {USER_TAG}=<their user> (set by an administrator)")
    return (f"IAM refused to run {document}, the any-user Command document: the cluster has "
            f"no document of its own for the user {user} (clusterUsers), and the any-user "
            "one is the admin policy's (AdminSessionPolicyArn). Ask an administrator to add "
            f"{user} to clusterUsers and tag your IAM identity {USER_TAG}={user}")


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


def caller_user(target: Target) -> str:
    """The cluster user the caller acts as: their ``dl-user`` principal tag if IAM lets dlc
    read it, else the name mapped from their ARN (:func:`user_from_arn`); never root."""
    arn = aws.caller_arn(target)
    tagged = aws.principal_tag(target, arn, USER_TAG)
    if tagged is not None and not USER_RE.fullmatch(tagged):
        raise UsageError(f"your IAM identity {arn} has the tag {USER_TAG}={tagged!r}, which "
                         "is not a Linux user name: give --as USER, or ask an administrator "
                         "to fix the tag")
    user = tagged or user_from_arn(arn)
    if user == "root":
        raise UsageError(f"your IAM identity {arn} maps to the user root, which jobs never "
                         "run as: give --as USER")
    return check_user(user)


class Remote:
    """Runs commands on one instance (the master) and waits for their result."""

    def __init__(self, target: Target, instance_id: str, *, poll: float = 0.25,
                 document: str | None = None, user: str | None = None) -> None:
        self.target = target
        self.instance_id = instance_id
        self.poll = poll
        self._document = document
        self._user = user

    @property
    def user(self) -> str:
        """The cluster user whose document runs the commands (:func:`caller_user` unless
        given; looked up once). A caller with no usable user (an identity that maps to
        root) runs the operator commands through the any-user document, "" here: only
        ``dl-run`` needs a user, and ``dlc submit`` names one (:meth:`as_user`)."""
        if self._user is None:
            try:
                self._user = caller_user(self.target)
            except UsageError:
                self._user = ""
        return self._user

    def as_user(self, user: str) -> Remote:
        """The same master through ``user``'s document (``dlc submit --as``)."""
        return Remote(self.target, self.instance_id, poll=self.poll,
                      user=check_user(user))

    @property
    def document(self) -> str:
        """The Command document for :attr:`user` (:func:`choose_document`, looked up once)."""
        if self._document is None:
            self._document = choose_document(aws.operator_documents(self.target), self.user)
        return self._document

    def run(self, argv: list[str], *, timeout: int = DEFAULT_TIMEOUT,
            run_as: str | None = None, offset: int = 0, limit: int = 0,
            workdir: str | None = None) -> Result:
        """Run ``argv`` on the instance (as ``run_as``; with ``limit``, only bytes
        ``offset`` .. ``offset + limit`` of its output; with ``workdir``, ``dl-run`` gets
        that staged directory); waits for it to end."""
        document = self.document
        fixed = document_user(document)
        if fixed is not None and run_as is not None:
            if run_as != fixed:  # never silently run as someone else
                raise UsageError(f"{document} runs jobs as {fixed} only, not {run_as}")
            run_as = None  # the user is the document's; it declares no runAs
        params = document_parameters(argv, timeout=timeout, run_as=run_as, offset=offset,
                                     limit=limit, workdir=workdir)
        text = shlex.join(argv)
        try:
            command_id = aws.send_command(self.target, self.instance_id, document, params,
                                          comment=f"dlc: {text}"[:100],
                                          delivery_timeout=DELIVERY_TIMEOUT)
        except AwsError as exc:
            if exc.code in ACCESS_DENIED:
                raise AwsError(f"{access_denied(document, self.user)} ({exc})") from None
            raise
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
        return self.parse(argv, res, allow_codes)

    def parse(self, argv: list[str], res: Result, allow_codes: tuple[int, ...] = (0,)
              ) -> object:
        """The JSON ``argv`` printed (:meth:`json`), or DlcError saying why there is none:
        not installed, a failing exit status, or output Run Command cut at its limit."""
        if res.code == NOT_INSTALLED:
            raise DlcError(f"{argv[0]} is not installed on the master {self.instance_id} "
                           f"(exit 127): {res.message()}")
        if res.code not in allow_codes:
            raise DlcError(f"{shlex.join(argv)} failed on the master (exit {res.code}): "
                           f"{res.message()}")
        try:
            return json.loads(res.stdout)
        except ValueError:
            if len(res.stdout) >= STDOUT_LIMIT:
                raise DlcError(f"{shlex.join(argv)} printed more than Run Command returns "
                               f"({STDOUT_LIMIT:,} characters of stdout): its JSON was cut "
                               "short on the way back from the master "
                               f"{self.instance_id}") from None
            raise DlcError(f"{shlex.join(argv)} printed no JSON on the master (exit "
                           f"{res.code}): {res.stdout[:300]!r} {res.message()[:300]}") from None
