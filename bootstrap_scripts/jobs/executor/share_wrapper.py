"""The parent of one process of a job's share: runs it, and records how it ended.

``python3 -I share_wrapper.py STATUS_FILE UID GID CWD -- ARGV...`` (UID/GID -1: keep the
wrapper's; CWD is entered after the switch to UID, so a user's working directory is
reached with that user's rights, never root's)

Why a wrapper: only a process's parent learns its exit status. When the job executor is
killed (``kill -9``, OOM, a crash) and systemd starts it again, the share's processes live
on but are nobody's children any more; without their exit status the new executor could
only guess, and a guess recorded as the job's own failure would be a lie. Each share
process therefore runs under this wrapper (root, in the share's process group, with the
share's ``DL_SHARE_TOKEN``), which outlives any executor, waits for its one child and writes
``{"returncode", "pid", "finished_at"}`` to ``STATUS_FILE`` (a root-only directory on the
node) before it exits the way its child did (same code, or killed by the same signal): to
the executor that started it, the wrapper is indistinguishable from the process itself.

Signals: SIGTERM/SIGINT/SIGHUP sent to the share's process group (or to every process with
its token) reach the child directly, so the wrapper only waits through them. SIGKILL ends
the wrapper too; the executor then records what it saw. Stdlib only, started with ``-I``:
it must not import anything from the job's working directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import resource
import signal
import sys
import time

#: ``protocol.jobs.LISTEN_FD_VARIABLE`` (this file imports nothing of the project: ``-I``).
LISTEN_FD_VARIABLE = "DL_LISTEN_FD"
#: Signals the wrapper lives through (they are meant for the job, which gets them too).
PASSED_ON = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: Python ignores these at start-up; a job must get them with their default action.
RESET_IN_CHILD = (signal.SIGPIPE, signal.SIGXFSZ)


def write_status(path: str, returncode: int, pid: int) -> None:
    """Atomically (tmp + rename): a reader sees the whole record or none. A write that
    fails (a full local disk: ENOSPC) leaves no temporary file behind."""
    tmp = f"{path}.tmp.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump({"returncode": returncode, "pid": pid, "finished_at": time.time()}, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def drop_to(uid: int, gid: int) -> None:
    """Become the job's user for good: its groups as a login gives them (none but ``gid``
    when it has no name), then gid, then uid (real, effective and saved)."""
    if gid >= 0:
        try:
            os.initgroups(pwd.getpwuid(uid).pw_name, gid)
        except KeyError:
            os.setgroups([])
        os.setresgid(gid, gid, gid)
    if uid >= 0:
        os.setresuid(uid, uid, uid)


def exec_child(argv: list[str], uid: int, gid: int, cwd: str) -> None:
    """In the forked child: drop to the job's user, enter ``cwd`` as that user, restore
    default signals, exec."""
    try:
        for sig in RESET_IN_CHILD + PASSED_ON:
            signal.signal(sig, signal.SIG_DFL)
        drop_to(uid, gid)
        if cwd:
            os.chdir(cwd)
        os.execvp(argv[0], argv)
    except OSError as exc:
        os.write(2, f"dl-executor: cannot start {argv[0]!r}: {exc}\n".encode())
    finally:
        os._exit(127)


def close_listener() -> None:
    """The listening socket the executor bound for the child (``DL_LISTEN_FD``, see
    ``executor/listeners.py``) is the child's: the wrapper keeps no copy, so the port is
    free again as soon as the child has ended."""
    fd = os.environ.get(LISTEN_FD_VARIABLE, "")
    if fd.isdigit() and int(fd) > 2:
        with contextlib.suppress(OSError):
            os.close(int(fd))


def exit_like(status: int) -> None:
    """End this process the way the child ended."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        time.sleep(1)  # a signal that does not kill (e.g. ignored by default): fall through
        os._exit(128 + sig)
    os._exit(os.waitstatus_to_exitcode(status))


def main(argv: list[str]) -> None:
    if len(argv) < 7 or argv[5] != "--":
        os.write(2, b"usage: share_wrapper.py STATUS_FILE UID GID CWD -- ARGV...\n")
        os._exit(2)
    status_path, uid, gid, cwd, command = argv[1], int(argv[2]), int(argv[3]), argv[4], argv[6:]
    for sig in PASSED_ON:
        signal.signal(sig, lambda *_: None)  # a handler, not SIG_IGN: exec resets it
    pid = os.fork()
    if pid == 0:
        exec_child(command, uid, gid, cwd)
    close_listener()
    # no core file of the wrapper when it re-raises the child's SIGSEGV (the child keeps
    # its own limit)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    _, status = os.waitpid(pid, 0)
    try:
        write_status(status_path, os.waitstatus_to_exitcode(status), pid)
    except OSError as exc:  # the executor then records what it saw of this wrapper
        os.write(2, f"dl-executor: cannot record the exit status in {status_path}: "
                    f"{exc}\n".encode())
    exit_like(status)


if __name__ == "__main__":
    main(sys.argv)
