"""The parent of one process of a job's share: runs it, and records how it ended.

``python3 -I -S share_wrapper.py LAUNCH_FD REPORT_FD``, started by the executor (root) with
the root allowlist as its whole environment (``engine/root_env.py``) and nothing of the job
in its argv. What to run comes on descriptor ``LAUNCH_FD``, an anonymous in-memory file
only this process can read: one JSON object ``{"status", "uid", "gid", "cwd", "fallback",
"argv", "env"}`` (UID/GID -1: keep the wrapper's). The job's argv, environment and working
directory are applied only in the forked child after it became the job's user: the
dynamic loader, the C library and Python read a process's environment as it starts, so
a root process started with the job's ``LD_PRELOAD`` or ``LD_AUDIT`` would load the user's
library as uid 0, and ``-I`` protects only from ``PYTHON*``. The child enters CWD (else
FALLBACK) as the user, so a user's directory is reached with that user's rights, never
root's, and looks ``argv[0]`` up in the job's own PATH as the user (``execvpe``). When that
``execve`` fails, the reason goes to ``REPORT_FD`` (close-on-exec: the executor, reading it,
sees end-of-file and nothing else when the command started) and to the share's log.

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
the wrapper too; the executor then records what it saw. Stdlib only, started with ``-I -S``:
it must not import anything from the job's working directory, and starts faster without
``site``.
"""

from __future__ import annotations

import contextlib
import errno
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
#: The largest launch description read (the executor's own: a bound, not a check).
MAX_LAUNCH_BYTES = 64 * 1024 * 1024
#: The exit status of a command that could not be started (the shell's).
CANNOT_START = 127


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


def enter(cwd: str, fallback: str) -> None:
    """Enter the job's working directory as its user, else ``fallback`` (the node's root:
    a spec's directory that is gone, or that the user cannot enter, is no reason to fail)."""
    try:
        os.chdir(cwd or fallback)
    except OSError:
        os.chdir(fallback)


def exec_child(launch: dict, report: int) -> None:
    """In the forked child: restore default signals, drop to the job's user, enter its
    directory as that user, then exec its command with its environment (PATH searched as
    that user). Why it could not: on ``report`` and in the log, exit 127."""
    argv = launch["argv"]
    try:
        os.set_inheritable(report, False)
        for sig in RESET_IN_CHILD + PASSED_ON:
            signal.signal(sig, signal.SIG_DFL)
        drop_to(launch["uid"], launch["gid"])
        enter(launch["cwd"], launch["fallback"])
        os.execvpe(argv[0], argv, launch["env"])
    except Exception as exc:  # whatever it was (an env name with "="): the child reports it
        missing = isinstance(exc, OSError) and exc.errno in (errno.ENOENT, errno.ENOTDIR)
        why = ("not found in PATH" if missing and os.sep not in argv[0] else
               "no such executable file" if missing else
               (exc.strerror if isinstance(exc, OSError) else "") or str(exc))
        message = f"cannot start {argv[0]!r}: {why}"
        with contextlib.suppress(OSError):
            os.write(report, message.encode())
        with contextlib.suppress(OSError):
            os.write(2, f"dl-executor: {message}\n".encode())
    finally:
        os._exit(CANNOT_START)


def close_listener(env: dict) -> None:
    """The listening socket the executor bound for the child (``DL_LISTEN_FD``, see
    ``executor/listeners.py``) is the child's: the wrapper keeps no copy, so the port is
    free again as soon as the child has ended."""
    fd = str(env.get(LISTEN_FD_VARIABLE, ""))
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


def read_launch(fd: int) -> dict:
    """The launch description on ``fd`` (read whole, then closed: the child must not
    inherit it)."""
    chunks, size = [], 0
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_LAUNCH_BYTES:
                raise ValueError("the launch description is too large")
    finally:
        os.close(fd)
    launch = json.loads(b"".join(chunks))
    if not isinstance(launch, dict) or not launch.get("argv"):
        raise ValueError("the launch description has no command")
    return launch


def main(argv: list[str]) -> None:
    if len(argv) != 3 or not argv[1].isdigit() or not argv[2].isdigit():
        os.write(2, b"usage: share_wrapper.py LAUNCH_FD REPORT_FD\n")
        os._exit(2)
    report = int(argv[2])
    try:
        launch = read_launch(int(argv[1]))
    except (OSError, ValueError) as exc:
        os.write(2, f"dl-executor: cannot read the share's launch: {exc}\n".encode())
        with contextlib.suppress(OSError):
            os.write(report, f"cannot read the share's launch: {exc}".encode())
        os._exit(2)
    for sig in PASSED_ON:
        signal.signal(sig, lambda *_: None)  # a handler, not SIG_IGN: exec resets it
    pid = os.fork()
    if pid == 0:
        exec_child(launch, report)
    os.close(report)  # the child's copy alone tells the executor whether the exec worked
    close_listener(launch["env"])
    # no core file of the wrapper when it re-raises the child's SIGSEGV (the child keeps
    # its own limit)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    _, status = os.waitpid(pid, 0)
    status_path = launch["status"]
    try:
        write_status(status_path, os.waitstatus_to_exitcode(status), pid)
    except OSError as exc:  # the executor then records what it saw of this wrapper
        os.write(2, f"dl-executor: cannot record the exit status in {status_path}: "
                    f"{exc}\n".encode())
    exit_like(status)


if __name__ == "__main__":
    main(sys.argv)
