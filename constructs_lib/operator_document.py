"""OperatorDocument: the one SSM Command document operators may run on a cluster's nodes.

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
   ``SSM_<name>``), the script splits ``arguments`` on spaces with globbing off, and an
   agent too old to set the variables makes the script refuse (it has no fallback that
   pastes the value into the script);
3. the script itself: ``dl-run`` (submitting a job) runs as the named user only, never as a
   user below UID 1000 (root and system users); ``dl-jobs``, ``dl-health`` and ``dl-scale``
   are operator operations and run as the agent (root), so their own checks apply.

``outputOffset`` / ``outputLimit`` read a long output in pieces below Run Command's output
limit (GetCommandInvocation returns 24,000 characters of stdout): the command's output is
kept in a temp file and bytes ``offset`` .. ``offset + limit`` are printed; the exit status
is the command's.

Parameter interpolation and allowedPattern:
https://docs.aws.amazon.com/systems-manager/latest/userguide/documents-syntax-data-elements-parameters.html
SendCommand's InvalidParameters:
https://docs.aws.amazon.com/systems-manager/latest/APIReference/API_SendCommand.html
"""

from __future__ import annotations

from aws_cdk import aws_ssm as ssm
from constructs import Construct

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

#: The script of the document's one step; it reads the parameters as SSM_<name> variables.
SCRIPT = [
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
    'user="${SSM_runAs:-}"',
    'if [ "$SSM_command" = dl-run ] && [ -z "$user" ]; then',
    '  echo "dl-operate: dl-run needs runAs (the user the job runs as)" >&2; exit 2',
    "fi",
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
    '  set -- "$switch" -u "$user" -- env HOME="$home" USER="$user" LOGNAME="$user"'
    ' "$SSM_command"',
    "else",
    '  set -- "$SSM_command"',
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
    '  "$@" $SSM_arguments > "$f"',
    "  rc=$?",
    '  tail -c +$(( ${SSM_outputOffset:-0} + 1 )) "$f" | head -c "$limit"',
    '  rm -f "$f"',
    "  exit $rc",
    "fi",
    'exec "$@" $SSM_arguments',
]


def _param(description: str, pattern: str, default: str, *, env: bool = True) -> dict:
    out = {"type": "String", "description": description, "default": default,
           "allowedPattern": pattern}
    if env:
        out["interpolationType"] = "ENV_VAR"
    return out


def document_content() -> dict:
    """The document (schema 2.2): its parameters, each with an allowedPattern, and the one
    ``aws:runShellScript`` step. Pure: the emulator's SSM Agent and the tests read it."""
    return {
        "schemaVersion": "2.2",
        "description": "Run one of the cluster's own commands (dl-run, dl-jobs, dl-health, "
                       "dl-scale) with validated parameters; dl-run as a named user, never "
                       "root. Not a shell.",
        "parameters": {
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
        },
        "mainSteps": [{
            "action": "aws:runShellScript",
            "name": STEP_NAME,
            "precondition": {"StringEquals": ["platformType", "Linux"]},
            "inputs": {"runCommand": SCRIPT, "timeoutSeconds": "{{ executionTimeout }}"},
        }],
    }


class OperatorDocument(Construct):
    """The cluster's Command document (module doc); ``document_name`` is its name (the
    name CloudFormation generates: one document per stack, no clash between clusters)."""

    def __init__(self, scope: Construct, construct_id: str) -> None:
        super().__init__(scope, construct_id)
        self.document = ssm.CfnDocument(
            self, "Document", content=document_content(), document_type="Command",
            document_format="JSON", target_type="/AWS::EC2::Instance",
            update_method="NewVersion")

    @property
    def document_name(self) -> str:
        return self.document.ref
