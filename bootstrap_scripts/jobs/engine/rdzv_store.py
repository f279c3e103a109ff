"""The rendezvous store of one torchrun job, hosted by a process of its own on the master.

``python rdzv_store.py --host ADDR --port PORT`` (run by file path with the job's
interpreter: it imports only the standard library and torch, so it needs no PYTHONPATH).

Why not let the master's torchrun agent host it (``--rdzv-conf is_host=true``)? Then the
store lives exactly as long as that agent. At the end of a successful job every agent
passes torch's exit barrier and closes the rendezvous; the master's agent, done first,
exits and takes the store with it while the other agents are still reading the barrier's
last key or closing the rendezvous: each of them then logs ``recvVector failed``, a
``RendezvousConnectionError`` and "failed to shutdown the rendezvous" with pages of C++
frames, on a job that succeeded. torch's c10d rendezvous backend accepts a store hosted
elsewhere (``is_host=false`` makes every agent a client of the endpoint), so the job's
store is this process, in the master's share; the master's executor keeps it up until
every other share of the job has exited (``jobs/shares.py``) and only then stops it.

Where it listens: on the socket the master's root executor bound for it before the share
started (``--rdzv-port``: the rendezvous window, ports only root can bind; the descriptor's
number in ``DL_LISTEN_FD``, ``executor/listeners.py``), so no other user's process can be
listening at the job's rendezvous address instead. Started without that variable (by hand,
or by an executor that binds nothing), it binds ``--host``/``--port`` itself, as before.

Prints nothing while it serves; a store that cannot listen exits 1 with the reason (the
executor then fails the master's share with it).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
from datetime import timedelta
from pathlib import Path

#: The label of this process in the master's share (its log: ``nodes/0-rdzv-store.log``);
#: the executor keeps it up until every other share of the job has exited (``shares.py``).
RDZV_STORE_LABEL = "rdzv-store"
#: Run by file path with the job's interpreter. The nodes are identical machines, so the
#: path ``dl-run`` computes is the master's too.
RDZV_STORE_SCRIPT = str(Path(__file__).resolve())
#: ``protocol.jobs.LISTEN_FD_VARIABLE`` (this file imports nothing of the project).
LISTEN_FD_VARIABLE = "DL_LISTEN_FD"


def inherited_listener(host: str, port: int) -> int | None:
    """The listening descriptor the executor handed over (None: none), checked to be a
    TCP socket listening on ``port``: a stray variable must not make the store serve on
    something else. ValueError when it is not."""
    value = os.environ.pop(LISTEN_FD_VARIABLE, "")
    if not value:
        return None
    if not value.isdigit():
        raise ValueError(f"{LISTEN_FD_VARIABLE}={value!r} is not a descriptor number")
    fd = int(value)
    sock = socket.socket(fileno=os.dup(fd))
    try:
        bound = sock.getsockname()
        if sock.type != socket.SOCK_STREAM or bound[1] != port or \
                not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            raise ValueError(f"descriptor {fd} is not a socket listening on {host}:{port} "
                             f"(bound to {bound})")
    finally:
        sock.close()
    return fd


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="rdzv_store.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", required=True, help="the master's address (the rdzv endpoint)")
    p.add_argument("--port", type=int, required=True, help="the rendezvous port")
    return p.parse_args(argv)


def stop(*_: object) -> None:
    """Exit at the first SIGTERM/SIGINT and ignore the next ones: a share is stopped with
    a signal to its process group and one to each of its processes, and a second one
    arriving during the interpreter's exit would print a traceback into the store's log."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(0)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from torch.distributed import TCPStore  # here: --help works without torch

    try:
        fd = inherited_listener(args.host, args.port)
        # The same kind of server torch's c10d backend creates when it hosts the store
        # itself; wait_for_workers=False: the agents connect whenever they start.
        store = TCPStore(args.host, args.port, is_master=True, wait_for_workers=False,
                         timeout=timedelta(seconds=60), master_listen_fd=fd)
    except (RuntimeError, ValueError, OSError) as exc:
        print(f"rdzv-store: cannot serve the rendezvous on {args.host}:{args.port}: {exc}",
              file=sys.stderr, flush=True)
        return 1
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        while True:
            signal.pause()
    finally:
        del store


if __name__ == "__main__":
    sys.exit(main())
