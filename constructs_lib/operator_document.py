"""OperatorDocument: the SSM Command documents operators run on a cluster's nodes.

Two kinds, one design: the *any-user* document takes the job's user as its ``runAs``
parameter (the opt-in admin policy runs it: ``dlc submit --as`` anyone), and each *per-user*
document (``user=``, one per ``clusterUsers`` entry, named ``dl-op.<cluster id>.<user>``:
:func:`user_document_name`) has that user written into its script and no ``runAs``
parameter at all. The operator policy lets each operator run only the per-user document
named by their own principal tag (``constructs_lib/operator_access.py``), because SendCommand
has no condition on a parameter's value: an IAM policy can only choose which documents a
principal runs, so the user must be the document's, not a parameter's.

``AWS-RunShellScript`` runs any script as root, so an operator policy that allows it is a
root shell on every node. This document runs only the product's own commands (``dl-run``,
``dl-jobs``, ``dl-health``, ``dl-scale``) with parameters SSM validates before it accepts
the command: each parameter has an ``allowedPattern``, and SendCommand with a value that
does not match is refused with ``InvalidParameters`` (nothing reaches the node).

Why it cannot be turned into a shell, in three layers:

1. the patterns: ``command`` is one of the four names; ``arguments`` are words of a
   conservative character set (no quote, ``$``, backquote, ``;``, ``|``, ``&``, ``<``,
   ``>``, parentheses, backslash, glob characters, ``~``, ``#``, newline); ``runAs`` is a
   Linux user name; the numbers are digits;
2. the values never become shell text: every parameter the script reads is passed as an
   environment variable (``interpolationType: ENV_VAR``, SSM Agent 3.3.2746.0 or later:
   ``SSM_<name>``), the script splits ``arguments`` on spaces with globbing off (for a
   command run as a user, that user's own shell does, from the environment ``runuser``
   keeps: ``runuser`` stays root and the command's parent for its whole run, and its
   command line, every user's to read, then holds no argument, e.g. no ``--env`` value),
   and an agent too old to set the variables makes the script refuse (it has no fallback
   that pastes the value into the script);
3. the script itself: ``dl-run`` (submitting a job) runs as the named user only, never as a
   user below UID 1000 (root and system users); ``dl-jobs``, ``dl-health`` and ``dl-scale``
   are operator operations and run as the agent (root), so their own checks apply. A
   per-user document runs ``dl-jobs`` with ``DL_OPERATOR_USER=<its user>`` in the
   environment, and ``dl-jobs cancel`` then refuses a job whose ``request.json`` is not that
   user's (the any-user document sets nothing: an admin cancels any job).

``outputOffset`` / ``outputLimit`` read a long output in pieces below Run Command's output
limit (GetCommandInvocation returns 24,000 characters of stdout): the command's output is
kept in a temp file and bytes ``offset`` .. ``offset + limit`` are printed; the exit status
is the command's.

Parameter interpolation and allowedPattern:
https://docs.aws.amazon.com/systems-manager/latest/userguide/documents-syntax-data-elements-parameters.html
SendCommand's InvalidParameters:
https://docs.aws.amazon.com/systems-manager/latest/APIReference/API_SendCommand.html
Document names (``^[a-zA-Z0-9_\\-.]{3,128}$``, no ``aws``/``amazon``/``amzn`` prefix):
https://docs.aws.amazon.com/systems-manager/latest/APIReference/API_CreateDocument.html
"""

from __future__ import annotations

import re

from aws_cdk import aws_ssm as ssm
from constructs import Construct

from constructs_lib.validation import ConfigError

#: The commands the document runs (the master's installed wrappers).
COMMANDS = ("dl-run", "dl-jobs", "dl-health", "dl-scale")
#: Characters an argument may hold: none of them means anything to sh after word splitting
#: with globbing off, and none starts a comment or an expansion. Spaces separate arguments.
ARGUMENT_CHARS = r"A-Za-z0-9_./:=,@%+-"
ARGUMENTS_PATTERN = rf"^[ {ARGUMENT_CHARS}]*$"
#: A Linux user name (useradd's default rule); empty = the agent's own user. Root and system
#: users also match: the script refuses them by UID (a pattern cannot know UIDs).
USER_PATTERN = r"^([a-z_][a-z0-9_-]{0,31})?$"
COMMAND_PATTERN = "^(" + "|".join(COMMANDS) + ")$"
NUMBER_PATTERN = r"^[0-9]{1,12}$"
#: ``dlc submit --workdir``: ``<staging bucket>/workdirs/<user>/<32 hex>.tar.gz``, or empty.
WORKDIR_PATTERN = (r"^([a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/workdirs/[a-z_][a-z0-9_-]{0,31}/"
                   r"[0-9a-f]{32}\.tar\.gz)?$")
TIMEOUT_PATTERN = r"^[0-9]{1,5}$"
#: Users below this UID are root and system accounts (Amazon Linux's UID_MIN).
FIRST_USER_UID = 1000
#: The step's name (GetCommandInvocation's PluginName).
STEP_NAME = "runDlCommand"
#: Per-user documents are named ``<prefix><cluster id>.<user>``. ``.`` is in neither a
#: cluster id (:data:`CLUSTER_ID_PATTERN`) nor a Linux user name, so a name says which
#: cluster and which user it is for and no two clusters' names can meet.
USER_DOCUMENT_PREFIX = "dl-op."
#: What a cluster id may be for its per-user documents' names (a stack name is one).
CLUSTER_ID_PATTERN = r"[A-Za-z0-9_-]+"
#: A per-user document's user, matched whole (``re.fullmatch``: no trailing newline).
USER_NAME = r"[a-z_][a-z0-9_-]{0,31}"
#: SSM's longest document name.
MAX_DOCUMENT_NAME = 128
#: dl-jobs reads this: the cluster user a per-user document acts for (cancel only theirs).
OPERATOR_USER_ENV = "DL_OPERATOR_USER"


def user_document_name(cluster_id: str, user: str) -> str:
    """The per-user document's name: the operator policy's SendCommand resource is this
    with ``${aws:PrincipalTag/<tag>}`` for ``user``."""
    return f"{USER_DOCUMENT_PREFIX}{cluster_id}.{user}"


#: Most users ``clusterUsers`` lists (a document each; a stack holds at most 500 resources).
MAX_CLUSTER_USERS = 100


def check_cluster_users(name: str, value: object) -> tuple[str, ...]:
    """The ``clusterUsers`` setting: Linux user names, comma-separated (context) or a list,
    distinct, none root; ConfigError naming the setting and the value."""
    items = value.split(",") if isinstance(value, str) else (
        list(value) if isinstance(value, list | tuple) else [value])
    users = tuple(str(u).strip() for u in items if str(u).strip())
    try:
        for user in users:
            check_cluster_user(user)
    except ValueError as exc:
        raise ConfigError(f"{name}: {exc}, got {value!r}") from None
    twice = sorted({u for u in users if users.count(u) > 1})
    if twice:
        raise ConfigError(f"{name} lists {', '.join(twice)} more than once, got {value!r}")
    if len(users) > MAX_CLUSTER_USERS:
        raise ConfigError(f"{name} may list at most {MAX_CLUSTER_USERS} users, got "
                          f"{len(users)}")
    return users


def check_cluster_user(user: str) -> str:
    """A name a per-user document may be for: a Linux user name, not root (ValueError)."""
    if not re.fullmatch(USER_NAME, user):
        raise ValueError(f"{user!r} is not a Linux user name ([a-z_][a-z0-9_-]*, at most 32 "
                         "characters)")
    if user == "root":
        raise ValueError("root: jobs never run as root; give the cluster's users")
    return user


def script(user: str | None = None) -> list[str]:
    """The document's one step; it reads the parameters as SSM_<name> variables. ``user``:
    the per-user document's fixed user (checked by :func:`check_cluster_user`, so it is a
    plain word in the script); None: the any-user document's ``runAs``."""
    if user is None:
        who = ['user="${SSM_runAs:-}"', *_NEEDS_RUN_AS]
        plain = ['  set -- "$SSM_command"', '  words="$SSM_arguments"']
    else:
        check_cluster_user(user)
        who = ['user=""', f'if [ "$SSM_command" = dl-run ]; then user={user}; fi']
        plain = [f'  set -- env {OPERATOR_USER_ENV}={user} "$SSM_command"',
                 '  words="$SSM_arguments"']
    return [*_HEAD, *who, *_SWITCH, *plain, *_TAIL]


_NEEDS_RUN_AS = [
    'if [ "$SSM_command" = dl-run ] && [ -z "$user" ]; then',
    '  echo "dl-operate: dl-run needs runAs (the user the job runs as)" >&2; exit 2',
    "fi",
]
_HEAD = [
    'if [ -z "${SSM_command+x}" ]; then',
    '  echo "dl-operate: this SSM Agent does not pass parameters as environment variables'
    ' (needs 3.3.2746.0 or later); refusing" >&2',
    "  exit 2",
    "fi",
    "set -f",
    'case "$SSM_command" in',
    f'  {"|".join(COMMANDS)}) ;;',
    '  *) echo "dl-operate: not a cluster command: $SSM_command" >&2; exit 2 ;;',
    "esac",
]
#: What the switched user's shell runs: the command with the arguments split as below.
_AS_USER = "'set -f; IFS=\" \"; exec \"$@\" $SSM_arguments'"
_SWITCH = [
    'if [ -n "$user" ]; then',
    '  entry=$(getent passwd "$user") || {',
    '    echo "dl-operate: no user $user on this node (cluster users are Linux users on'
    ' every node)" >&2; exit 3; }',
    '  uid=$(printf %s "$entry" | cut -d: -f3)',
    '  home=$(printf %s "$entry" | cut -d: -f6)',
    f'  if [ "$uid" -lt {FIRST_USER_UID} ]; then',
    f'    echo "dl-operate: refusing to run as $user (uid $uid < {FIRST_USER_UID}: root or'
    ' a system user)" >&2; exit 2',
    "  fi",
    '  switch=$(PATH="$PATH:/usr/sbin:/sbin" command -v runuser) || {',
    '    echo "dl-operate: runuser (util-linux) is not installed" >&2; exit 1; }',
    '  cd "$home" 2>/dev/null || cd /',
    # the arguments are expanded by the user's own shell, from the environment runuser
    # keeps: runuser (root) waits for the command, and its argv is every user's to read
    '  set -- "$switch" -u "$user" -- env HOME="$home" USER="$user" LOGNAME="$user"'
    f" sh -c {_AS_USER} dl-operate \"$SSM_command\"",
    '  words=""',
    "else",
]
_TAIL = [
    "fi",
    'workdir="${SSM_workdir:-}"',
    'if [ -n "$workdir" ]; then',
    '  if [ "$SSM_command" != dl-run ]; then',
    '    echo "dl-operate: workdir goes with dl-run only" >&2; exit 2',
    "  fi",
    '  case "$workdir" in',
    '    */workdirs/"$user"/*) ;;',
    '    *) echo "dl-operate: $workdir is not under workdirs/$user/" >&2; exit 2 ;;',
    "  esac",
    '  a=$(mktemp) || exit 1',
    '  if ! dl-fetch-workdir "$workdir" > "$a"; then rm -f "$a"; exit 1; fi',
    '  exec < "$a"',
    '  rm -f "$a"',
    '  set -- "$@" --workdir-archive -',
    "fi",
    "IFS=' '",
    'limit="${SSM_outputLimit:-0}"',
    'if [ "$limit" -gt 0 ]; then',
    '  f=$(mktemp) || exit 1',
    '  "$@" $words > "$f"',
    "  rc=$?",
    '  tail -c +$(( ${SSM_outputOffset:-0} + 1 )) "$f" | head -c "$limit"',
    '  rm -f "$f"',
    "  exit $rc",
    "fi",
    'exec "$@" $words',
]


def _param(description: str, pattern: str, default: str, *, env: bool = True) -> dict:
    out = {"type": "String", "description": description, "default": default,
           "allowedPattern": pattern}
    if env:
        out["interpolationType"] = "ENV_VAR"
    return out


def document_content(user: str | None = None) -> dict:
    """The document (schema 2.2): its parameters, each with an allowedPattern, and the one
    ``aws:runShellScript`` step; with ``user``, that user's document (no ``runAs``). Pure:
    the emulator's SSM Agent and the tests read it."""
    params = _parameters()
    if user is not None:
        del params["runAs"]
    who = "as a named user" if user is None else f"as {user} only"
    return {
        "schemaVersion": "2.2",
        "description": "Run one of the cluster's own commands (dl-run, dl-jobs, dl-health, "
                       f"dl-scale) with validated parameters; dl-run {who}, never "
                       "root. Not a shell.",
        "parameters": params,
        "mainSteps": [{
            "action": "aws:runShellScript",
            "name": STEP_NAME,
            "precondition": {"StringEquals": ["platformType", "Linux"]},
            "inputs": {"runCommand": script(user), "timeoutSeconds": "{{ executionTimeout }}"},
        }],
    }


def _parameters() -> dict:
    return {
        "command": _param("dl-run, dl-jobs, dl-health or dl-scale", COMMAND_PATTERN,
                          "dl-health"),
        "arguments": _param("the command's arguments, separated by single spaces "
                            f"(characters {ARGUMENT_CHARS} only)",
                            ARGUMENTS_PATTERN, ""),
        "runAs": _param("the Linux user dl-run runs as (uid >= 1000, never root)",
                        USER_PATTERN, ""),
        "workdir": _param("dl-run: a directory dlc staged, <bucket>/workdirs/<user>/"
                          "<id>.tar.gz, fetched as root and unpacked by the user's dl-run "
                          "into the job's directory", WORKDIR_PATTERN, ""),
        "outputOffset": _param("print the output from this byte", NUMBER_PATTERN, "0"),
        "outputLimit": _param("print at most this many bytes (0: all, no temp file)",
                              NUMBER_PATTERN, "0"),
        "executionTimeout": _param("seconds before the command is stopped",
                                   TIMEOUT_PATTERN, "120", env=False),
    }


class OperatorDocument(Construct):
    """One of the cluster's Command documents (module doc); ``document_name`` is its name."""

    def __init__(self, scope: Construct, construct_id: str, *, user: str | None = None,
                 name: str | None = None) -> None:
        """
        :param user: the cluster user the document submits jobs as (its per-user document,
            no ``runAs`` parameter).
            :default: none: the any-user document, whose ``runAs`` names the user
        :param name: the document's name (a per-user document's is
            :func:`user_document_name`, the name the operator policy allows).
            :default: a name CloudFormation generates (one per stack, no clash)
        """
        super().__init__(scope, construct_id)
        self.user = user
        self.document = ssm.CfnDocument(
            self, "Document", content=document_content(user), document_type="Command",
            document_format="JSON", target_type="/AWS::EC2::Instance",
            update_method="NewVersion", name=name)

    @property
    def document_name(self) -> str:
        return self.document.ref
