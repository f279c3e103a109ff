"""``dlc tensorboard JOB``: a job's TensorBoard on the laptop's browser.

Two steps, both through what ``dlc`` already uses (no new permission, no open port):

1. ``dl-jobs tensorboard JOB`` on the master through the operator channel (SSM Run Command,
   :mod:`dlc.remote`): it starts TensorBoard as the job's user, bound to 127.0.0.1 on the
   master, reading only ``managed/<user>/<job-id>/tensorboard/`` (or answers with the one already
   running), and prints its port and the secret path it serves under (anything else on the
   master's loopback gets 404: bootstrap_scripts/ops/tensorboard_server.py);
2. a Session Manager port forwarding session (``AWS-StartPortForwardingSession``, as ``dlc
   tunnel``) from ``localhost:LOCAL`` to that port on the master: the SSM Agent on the master
   connects to its own 127.0.0.1, so TensorBoard never listens on the network.

``--dry-run`` still starts TensorBoard (its port is only known then) and prints the
``aws ssm start-session`` command instead of running it.
"""

from __future__ import annotations

from collections.abc import Callable

from bootstrap_scripts.protocol.tensorboard_path import SERVED_PATH_RE
from dlc import session
from dlc.errors import DlcError
from dlc.remote import Remote
from dlc.target import Target

#: Port TensorBoard is asked for on the master (the next free one is taken if busy).
REMOTE_PORT = 6006
#: The remote command's time bound: TensorBoard starts in a few seconds.
START_TIMEOUT = 120


def start_argv(job: str, minutes: int) -> list[str]:
    return ["dl-jobs", "tensorboard", job, "--port", str(REMOTE_PORT),
            "--minutes", str(minutes)]


def open_board(target: Target, remote: Remote, job: str, *, minutes: int,
               local_port: int | None, dry_run: bool, echo: Callable[[str], None]) -> None:
    """Start (or find) the job's TensorBoard on the master, then forward a local port to it."""
    served = remote.json(start_argv(job, minutes), timeout=START_TIMEOUT)
    if not isinstance(served, dict) or not isinstance(served.get("port"), int):
        raise DlcError(f"dl-jobs tensorboard {job} answered without a port: {served!r}")
    port, path = served["port"], served.get("path")
    if not isinstance(path, str) or not SERVED_PATH_RE.fullmatch(path):
        raise DlcError(f"dl-jobs tensorboard {job} answered without its secret path: the "
                       f"master runs an older dl-jobs (update the cluster): {served!r}")
    local = local_port or port
    session.check_ports(port, local)
    state = "already running" if served.get("already_running") else "started"
    echo(f"TensorBoard of job {job} {state} on the master (port {port}, as uid "
         f"{served.get('uid')}, stops after {minutes} min or with dlc tensorboard {job} "
         f"--stop): open http://localhost:{local}{path} while the tunnel runs (the path is "
         f"the page's key: keep it to yourself)")
    session.start(target, session.tunnel_argv(target, remote.instance_id, port, local),
                  dry_run=dry_run, echo=echo)


def stop_board(remote: Remote, job: str) -> str:
    answer = remote.json(["dl-jobs", "tensorboard", job, "--stop"], timeout=START_TIMEOUT)
    return str(answer.get("message", answer)) if isinstance(answer, dict) else str(answer)
