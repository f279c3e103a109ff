"""``dl-jobs tensorboard JOB``: TensorBoard for one managed job, on this node, as its user.

    dl-jobs tensorboard JOB [--port P] [--minutes M]   start it (or find it running), JSON
    dl-jobs tensorboard JOB --stop                      stop it

It serves the job's own directory, ``managed/<job-id>/tensorboard/`` (the ranks write it,
``bootstrap_scripts.tensorboard_log``), bound to 127.0.0.1 only: nothing on the network
reaches it; ``dlc tensorboard JOB`` forwards a laptop port to it through Session Manager
(``AWS-StartPortForwardingSession``), which the SSM Agent serves from this node's loopback.

Loopback is shared by every process on the master, other cluster users' included, and
TensorBoard has no authentication: it serves under a random secret path (192 bits, a new
one per start), answers 404 everywhere else, and gets the secret on a pipe, never on its
command line (``bootstrap_scripts.ops.tensorboard_run``). The URL with the secret is kept
only in the state directory below and printed to whoever started it.

Who it runs as (:func:`run_as`, a pure decision): the job's user, the owner of the job's
``request.json`` (read without following links, owned by the owner of its directory:
``userfiles.read_owned``), never root nor a system user (uid < 1000). Root (the operator
channel's ``dl-jobs`` runs as root) starts it with that user's uid, gid and groups; a user
starts it only for their own jobs. Root never reads the event files: TensorBoard does, with
the user's rights, so a link the user planted in their directory leads only where the user
could read anyway.

It lives ``--minutes`` (default 120; ``timeout`` ends it) in a session of its own; its pid,
port and log are kept in a root-only directory (``/run/dl-tensorboard``; a user's own
``$TMPDIR/dl-tensorboard-<uid>`` otherwise), under the job's user AND id
(``<user>/<job-id>.json``: two users' jobs of the same id never share a record), so asking
again for the same job answers with the running one, and ``--stop`` ends its whole process
group, never another user's server.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bootstrap_scripts.jobs.engine import userfiles
from bootstrap_scripts.protocol import record_base, store
from bootstrap_scripts.protocol.job_paths import ManagedPaths

#: Jobs run as uid >= this (the executors refuse lower): TensorBoard too.
MIN_UID = 1000
DEFAULT_PORT = 6006
#: Ports tried from the one asked for (another job's TensorBoard may hold it).
PORT_TRIES = 100
DEFAULT_MINUTES = 120
ROOT_STATE_DIR = Path("/run/dl-tensorboard")
#: How long a new TensorBoard gets to accept connections.
READY_SECONDS = 60.0
HOST = "127.0.0.1"


class TensorBoardError(Exception):
    """Why TensorBoard was not started (the message is for the user)."""


@dataclass(frozen=True)
class Served:
    """A job's TensorBoard: what ``dl-jobs tensorboard`` prints (JSON), what is kept."""

    job_id: str
    logdir: str
    port: int
    pid: int
    uid: int
    started: float
    url: str = ""
    already_running: bool = False
    #: the secret path TensorBoard serves under (``/<secret>/``): the URL's path
    path: str = ""


def run_as(owner_uid: int, euid: int) -> int:
    """The uid TensorBoard runs as for a job owned by ``owner_uid``, started by ``euid``;
    TensorBoardError when it must not run: never as root or a system user, and a user only
    for their own jobs."""
    if owner_uid < MIN_UID:
        raise TensorBoardError(f"the job belongs to uid {owner_uid}: TensorBoard runs as the "
                               f"job's user, never as root or a system user (uid < {MIN_UID})")
    if euid not in (0, owner_uid):
        raise TensorBoardError(f"the job belongs to uid {owner_uid}, not to you (uid {euid})")
    return owner_uid


def job_owner(paths: ManagedPaths) -> tuple[int, int]:
    """(uid, gid) of the job's submitter: its ``request.json``, no link, its directory's."""
    try:
        owned = userfiles.read_owned(paths.dir, paths.request.name)
    except OSError as exc:
        raise TensorBoardError(f"job {paths.job_id}: {exc}") from None
    return owned.uid, owned.gid


#: the module that runs TensorBoard behind its secret path (read from stdin)
RUNNER = "bootstrap_scripts.ops.tensorboard_run"


def server_argv(logdir: Path, port: int, minutes: int) -> list[str]:
    """TensorBoard on ``logdir`` at 127.0.0.1:``port``, ended by ``timeout`` after
    ``minutes`` (this interpreter's ``tensorboard`` package). No secret in it: a command
    line is public on the node."""
    return ["timeout", "--kill-after=10", f"{int(minutes)}m", sys.executable, "-m",
            RUNNER, "--logdir", str(logdir), "--host", HOST, "--port", str(port),
            "--reload_interval", "5"]


def new_prefix() -> str:
    """A fresh secret path prefix: 192 random bits, URL-safe."""
    return "/" + secrets.token_urlsafe(24)


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def pick_port(first: int, free=port_free) -> int:
    for port in range(first, min(first + PORT_TRIES, 65536)):
        if free(port):
            return port
    raise TensorBoardError(f"no free port on {HOST} from {first} to {first + PORT_TRIES - 1}")


def state_dir() -> Path:
    """Where the running TensorBoards are recorded: root's, or this user's own."""
    if os.geteuid() == 0:
        return ROOT_STATE_DIR
    return Path(tempfile.gettempdir()) / f"dl-tensorboard-{os.geteuid()}"


def _state_fd_dir() -> Path:
    d = state_dir()
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = userfiles.open_dir(d)
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise TensorBoardError(f"{d} must be ours (uid {os.geteuid()}) and mode 0700")
    return d


def state_file(paths: ManagedPaths, suffix: str) -> Path:
    """The record (``.json``) or output (``.log``) of the job's TensorBoard, keyed by the
    job's user and id: ``<state dir>/<user>/<job-id><suffix>``."""
    user_dir = _state_fd_dir() / paths.user
    user_dir.mkdir(mode=0o700, exist_ok=True)
    return user_dir / f"{paths.job_id}{suffix}"


def running(paths: ManagedPaths) -> Served | None:
    """The job's recorded TensorBoard if its process still runs and serves this very job's
    directory (a record of another job, or a reused pid, is none)."""
    try:
        text = store.read_text(state_file(paths, ".json"), limit=64 * 1024)
        data = record_base.loads(text or "null")
        served = Served(**data) if isinstance(data, dict) else None
    except (OSError, ValueError, TypeError):  # ProtocolError is a ValueError
        return None
    if served is None or served.logdir != str(paths.tensorboard_dir):
        return None
    return served if _is_ours(served) else None


def _is_ours(served: Served) -> bool:
    """Whether pid ``served.pid`` is still that TensorBoard (a session leader whose
    command line names its log directory), not a process that reused the number."""
    try:
        cmdline = Path(f"/proc/{served.pid}/cmdline").read_bytes().split(b"\0")
        return os.getpgid(served.pid) == served.pid and RUNNER.encode() in cmdline \
            and served.logdir.encode() in cmdline
    except OSError:
        return False


def start(paths: ManagedPaths, *, port: int = DEFAULT_PORT,
          minutes: int = DEFAULT_MINUTES) -> Served:
    """Start the job's TensorBoard (or return the running one) once it accepts connections."""
    uid, gid = job_owner(paths)
    run_as(uid, os.geteuid())
    found = running(paths)
    if found is not None:
        return Served(**{**asdict(found), "already_running": True})
    port = pick_port(port)
    logdir = paths.tensorboard_dir
    as_user: dict = {}
    if os.geteuid() != uid:  # root: the job's user, their groups, nothing of root's
        as_user = {"user": uid, "group": gid, "extra_groups": userfiles.groups_of(uid, gid)}
    # this package first on its path (the runner is in it), in "/": nothing the user
    # controls shadows it
    package_parent = str(Path(__file__).resolve().parents[2])
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/tmp",
           "PYTHONPATH": os.pathsep.join(p for p in (package_parent,
                                                     os.environ.get("PYTHONPATH", "")) if p)}
    prefix = new_prefix()
    log_path, record_path = state_file(paths, ".log"), state_file(paths, ".json")
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(server_argv(logdir, port, minutes), cwd="/", env=env,
                                stdin=subprocess.PIPE, stdout=log, stderr=log,
                                start_new_session=True, **as_user)
    with contextlib.suppress(BrokenPipeError):  # it died at once: reported below
        proc.stdin.write(f"{prefix}\n".encode())
        proc.stdin.close()
    served = Served(job_id=paths.job_id, logdir=str(logdir), port=port, pid=proc.pid, uid=uid,
                    started=time.time(), url=f"http://{HOST}:{port}{prefix}/",
                    path=f"{prefix}/")
    deadline = time.monotonic() + READY_SECONDS
    while not _accepts(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            _kill_group(proc.pid)
            tail = log_path.read_bytes()[-1500:].decode(errors="replace")
            raise TensorBoardError(f"TensorBoard for job {paths.job_id} did not start "
                                   f"(exit {proc.poll()}):\n{tail}")
        time.sleep(0.2)
    record = os.open(record_path,  # holds the secret: root's (or ours) only
                     os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(record, "w") as out:
        out.write(json.dumps(asdict(served)))
    return served


def _accepts(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((HOST, port)) == 0


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGTERM)


def stop(paths: ManagedPaths) -> str:
    """End the job's TensorBoard (its whole session) and forget it."""
    uid, _ = job_owner(paths)
    run_as(uid, os.geteuid())
    found = running(paths)
    for suffix in (".json", ".log"):  # its record and its output: nothing left behind
        with contextlib.suppress(OSError):
            state_file(paths, suffix).unlink()
    if found is None:
        return f"no TensorBoard runs for job {paths.job_id}"
    _kill_group(found.pid)
    return f"stopped TensorBoard of job {paths.job_id} (pid {found.pid}, port {found.port})"
