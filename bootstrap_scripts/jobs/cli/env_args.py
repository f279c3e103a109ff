"""``dl-run``'s job environment options, and keeping their values off its command line.

Every user of a node can read every process's ``/proc/<pid>/cmdline``; only the process's
own user and root can read its ``/proc/<pid>/environ``. A value given as ``--env
KEY=VALUE`` is therefore readable by everyone for as long as ``dl-run`` runs (the whole
job, when it follows it). Three ways keep a value off every command line:

* ``--env KEY`` takes the value from ``dl-run``'s own environment (as ``docker run -e
  KEY``);
* ``--env-file FILE`` reads ``KEY=VALUE`` lines from a file (read as the user who runs
  ``dl-run``);
* a ``--env KEY=VALUE`` that was given anyway is moved at once: ``dl-run`` runs itself
  again (the same process, :func:`hide_values`) with ``--env KEY`` in its argv and the
  value in a private variable of its environment (:data:`CARRIER`), which :func:`carried`
  takes out before anything else reads the environment. Until that ``execve`` (the
  interpreter's start) the value is on the command line, and it stays in the shell's
  history: the first two ways are the ones for a secret.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from bootstrap_scripts.jobs.engine.outcomes import EXIT_USAGE, RunError

#: The private variable that carries ``--env`` values across :func:`hide_values`'s re-exec.
CARRIER = "DL_RUN_ENV_VALUES"
#: The longest ``--env-file`` read (a job's environment, not a data set).
MAX_ENV_FILE_BYTES = 1024 * 1024
OPTION = "--env"

_carried: dict[str, str] | None = None


def hide_values(options: list[str]) -> tuple[list[str], dict[str, str]] | None:
    """``options`` (dl-run's, before its command) with every ``--env KEY=VALUE`` (or
    ``--env=KEY=VALUE``) turned into ``--env KEY``, and the values taken out; None when
    there was none to take."""
    out: list[str] = []
    values: dict[str, str] = {}
    i = 0
    while i < len(options):
        tok = options[i]
        if tok == OPTION and i + 1 < len(options):
            item, i = options[i + 1], i + 2
        elif tok.startswith(OPTION + "="):
            item, i = tok[len(OPTION) + 1:], i + 1
        else:
            out.append(tok)
            i += 1
            continue
        key, sep, value = item.partition("=")
        if sep and key:
            values[key] = value
            out += [OPTION, key]
        else:
            out += [OPTION, item]
    return (out, values) if values else None


def carried() -> dict[str, str]:
    """The values :func:`hide_values` moved into :data:`CARRIER` (taken out of this
    process's environment on the first call, so that no child inherits them)."""
    global _carried
    if _carried is None:
        text = os.environ.pop(CARRIER, "")
        try:
            data = json.loads(text) if text else {}
        except ValueError:
            data = {}
        _carried = {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}
    return _carried


def check_key(key: str, where: str) -> str:
    """A name an environment can hold: not empty, no ``=``, no NUL (RunError naming
    ``where`` otherwise)."""
    if not key or "=" in key or "\0" in key:
        raise RunError(f"{where}: {key!r} is not a variable name an environment can hold "
                       f"(KEY=VALUE or KEY; no NUL)", EXIT_USAGE)
    return key


def check_value(key: str, value: str, where: str) -> str:
    if "\0" in value:
        raise RunError(f"{where}: the value of {key} holds a NUL byte", EXIT_USAGE)
    return value


def read_env_file(path: str) -> dict[str, str]:
    """``KEY=VALUE`` lines (as ``docker run --env-file``: blank lines and ``#`` comments
    skipped, no quotes removed, a line ``KEY`` alone takes KEY from this environment)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_ENV_FILE_BYTES + 1)
    except OSError as exc:
        raise RunError(f"--env-file {path}: {exc.strerror or exc}", EXIT_USAGE) from None
    if len(data) > MAX_ENV_FILE_BYTES:
        raise RunError(f"--env-file {path}: larger than {MAX_ENV_FILE_BYTES} bytes",
                       EXIT_USAGE)
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise RunError(f"--env-file {path}: not UTF-8 text", EXIT_USAGE) from None
    env: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, value = line.partition("=")
        where = f"--env-file {Path(path).name} line {number}"
        check_key(key, where)
        env[key] = check_value(key, value if sep else from_environment(key, where), where)
    return env


def from_environment(key: str, where: str) -> str:
    """KEY's value in this process's environment (or carried across the re-exec)."""
    if key in carried():
        return carried()[key]
    if key not in os.environ:
        raise RunError(f"{where}: {key} is not set in dl-run's environment (give "
                       f"{key}=VALUE, or export it first)", EXIT_USAGE)
    return os.environ[key]


def given_env(env_options: list[str], env_files: list[str]) -> dict[str, str]:
    """The job's variables from ``--env-file`` (in order) then ``--env`` (which wins)."""
    env: dict[str, str] = {}
    for path in env_files:
        env.update(read_env_file(path))
    for item in env_options:
        key, sep, value = item.partition("=")
        where = f"--env {key}"
        check_key(key, where)
        env[key] = check_value(key, value if sep else from_environment(key, where), where)
    return env
