"""Can a job's command be started? The one check, made twice: by the executor before it
starts a share's process (so a typo fails the start with a clear error, not exit status 127),
and by ``dl-run`` on the master, as the submitting user, before a managed job is queued (so
``dl-run -- no-such-command`` is refused at once instead of failing after its nodes were
gathered, with the cause buried under the launcher's traceback). Every node runs the same
image, so what the master cannot find, no node can.
"""

from __future__ import annotations

import os
import shutil


def missing_command(argv0: str, env: dict[str, str], cwd: str) -> str:
    """Why ``argv0`` cannot be run ("" if it can): checked here, before the wrapper starts,
    so that a typo still fails the start with a clear error instead of an exit code 127."""
    if os.sep in argv0:
        path = os.path.join(cwd, argv0)
        return "" if os.path.isfile(path) and os.access(path, os.X_OK) else \
            f"cannot start {argv0!r}: no such executable file"
    if shutil.which(argv0, path=env.get("PATH", os.defpath)):
        return ""
    return f"cannot start {argv0!r}: not found in PATH"


def submit_problem(command: list[str] | tuple[str, ...], env: dict[str, str], cwd: str
                   ) -> str:
    """Why the job's command cannot start on the cluster ("" if it can, or if it cannot be
    known yet): a bare name is looked up in the job's ``PATH`` (the submitter's, else this
    process's), an absolute path must be an executable file. A relative path is left to the
    executor: it may name a file of a directory shipped with the job (``--workdir``), which
    is unpacked only when the job starts."""
    if not command:
        return ""
    argv0 = command[0]
    if argv0 == "-m" or argv0.endswith(".py"):
        # a module or a script the launcher runs with the interpreter
        # (``plan_types.python_command``, torchrun's own ``-m``): nothing to look up in PATH
        return ""
    if os.sep in argv0 and not os.path.isabs(argv0):
        return ""
    path = env.get("PATH") or os.environ.get("PATH", os.defpath)
    return missing_command(argv0, {"PATH": path}, cwd)
