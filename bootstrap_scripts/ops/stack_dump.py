"""Dump the Python stacks of one node's ranks of a hung job (run as root by the executor).

    python -m bootstrap_scripts.ops.stack_dump --efs EFS --job-id ID --uid UID --gid GID

The job controller runs it on every node of a hung attempt as an ``each`` job of its own
(``ops/hang_stacks.py``), so it runs as root on the node that hosts the ranks, which
``py-spy dump`` needs (it reads another process's memory: ptrace, CAP_SYS_PTRACE).
Each rank's dump (a ``RankStack``: ``stack``, the text of every thread, innermost frame
first; ``signature``, the main thread's ``file:function`` frames, what ranks are compared
on; ``error``) goes to ``jobs/<id>/stacks/<rank>.json``, written **as the job's user**
(the user's directory, the user's rights, mode 0600): the stacks are the user's, and this
job's own log (a root job's, which other users may read) gets only one ``DL-STACK {json}``
line per rank found: ``rank``, ``pid``, ``written``, ``error``.

Which processes (root trusting nothing of the user's): a process is a rank of the job on
this node only if its real uid is the job's user (``--uid``, the job's owner as the
controller read it from ``fstat``), its environment has the share token the executor gave
every process of the job's share on this node (``DL_SHARE_TOKEN=<user>/<job-id>/<rank>/<address>``,
``procgroup.share_token``; this dump's own share carries this node's address the same way)
and a rank variable (``RANK``, ``OMPI_COMM_WORLD_RANK``, ``PMI_RANK``). A user can set those
variables in their own processes only, so the dump never reaches another user's or root's
process. A rank's own children (data loader workers inherit the same environment) are
left out: the topmost process of each rank is dumped.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from bootstrap_scripts.jobs.engine import userfiles
from bootstrap_scripts.jobs.engine.hang_rules import stack_signature
from bootstrap_scripts.progress import RANK_ENVS
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.managed_records import RankStack
from bootstrap_scripts.protocol.paths import ClusterPaths, validate_job_id

TOKEN_ENV = "DL_SHARE_TOKEN"

MARKER = "DL-STACK "
DEFAULT_TIMEOUT = 20.0
MAX_ENVIRON = 1 << 20


def read_environ(pid: int) -> dict[str, str]:
    """The process's environment as it started (``/proc/<pid>/environ``); {} if gone."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            raw = fh.read(MAX_ENVIRON)
    except OSError:
        return {}
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def status_ids(pid: int) -> tuple[int, int] | None:
    """(real uid, parent pid) of a process, from ``/proc/<pid>/status``; None if gone."""
    uid = ppid = None
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("Uid:"):
                    uid = int(line.split()[1])
                elif line.startswith("PPid:"):
                    ppid = int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return (uid, ppid) if uid is not None and ppid is not None else None


def rank_of(env: dict[str, str]) -> int | None:
    for name in RANK_ENVS:
        value = env.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def this_address() -> str:
    """This node's address, from this dump's own share token (``<job>/<rank>/<address>``)."""
    return os.environ.get(TOKEN_ENV, "").rpartition("/")[2]


def of_the_job(token: str, job_id: str, address: str) -> bool:
    """Is ``token`` the one of the share of ``job_id`` (its key ``<user>/<id>``) on the node
    at ``address``?"""
    head, _sep, addr = token.rpartition("/")
    job, _sep, rank = head.rpartition("/")
    return job == job_id and addr == address and rank.isdigit()


def find_ranks(job_id: str, address: str, uid: int, proc: Path = Path("/proc")
               ) -> dict[int, int]:
    """{rank: pid} of this node's processes of the job (see the module's docstring)."""
    found: dict[int, tuple[int, int]] = {}  # pid -> (rank, ppid)
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        ids = status_ids(pid)
        if ids is None or ids[0] != uid:
            continue
        env = read_environ(pid)
        rank = rank_of(env)
        if rank is None or not of_the_job(env.get(TOKEN_ENV, ""), job_id, address):
            continue
        found[pid] = (rank, ids[1])
    ranks: dict[int, int] = {}
    for pid, (rank, ppid) in sorted(found.items()):
        if found.get(ppid, (None,))[0] == rank:
            continue  # a child of the rank (a data loader worker)
        ranks.setdefault(rank, pid)
    return ranks


def py_spy() -> str:
    """py-spy of this interpreter's environment (where pip put it: beside the interpreter,
    or the environment's scripts directory), else on PATH."""
    for d in (Path(sys.executable).parent, Path(sysconfig.get_path("scripts"))):
        if (d / "py-spy").exists():
            return str(d / "py-spy")
    return shutil.which("py-spy") or "py-spy"


def render(threads: list[dict]) -> tuple[str, str]:
    """(text of every thread, signature of the main thread) of py-spy's JSON dump."""
    lines, main = [], ""
    for t in threads:
        state = "active" if t.get("active") else "idle"
        lines.append(f"Thread {t.get('os_thread_id')} ({t.get('thread_name') or '-'}, {state})")
        frames = t.get("frames") or []
        for f in frames:
            lines.append(f"    {f.get('name')} ({f.get('filename')}:{f.get('line')})")
        if t.get("thread_name") == "MainThread" or t.get("os_thread_id") == t.get("pid"):
            main = stack_signature([(str(f.get("short_filename") or f.get("filename")),
                                     str(f.get("name"))) for f in frames])
    return "\n".join(lines), main


def dump(pid: int, *, timeout: float, exe: str = "") -> dict:
    """``py-spy dump --json`` of one process: {"stack", "signature", "error"}."""
    try:
        done = subprocess.run([exe or py_spy(), "dump", "--pid", str(pid), "--json"],
                              capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"stack": "", "signature": "", "error": f"py-spy: {exc}"}
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        return {"stack": "", "signature": "", "error": f"py-spy: {why}"[:500]}
    try:
        stack, signature = render(json.loads(done.stdout))
    except (ValueError, TypeError, AttributeError) as exc:
        return {"stack": "", "signature": "", "error": f"py-spy's output: {exc}"}
    return {"stack": stack, "signature": signature, "error": ""}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="stack_dump", description=__doc__.split("\n\n")[0])
    p.add_argument("--efs", required=True, help="the EFS mount point")
    p.add_argument("--job-id", required=True, help="the attempt's job id (<id>.<n>)")
    p.add_argument("--uid", type=int, required=True, help="the job's user")
    p.add_argument("--gid", type=int, required=True, help="the job's group")
    p.add_argument("--address", default="", help="this node's address (default: from this "
                   "share's own DL_SHARE_TOKEN)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                   help="seconds py-spy gets per process")
    args = p.parse_args(argv)
    address = args.address or this_address()
    try:
        validate_job_id(args.job_id)
    except ValueError as exc:
        p.error(str(exc))
    if args.uid < 0 or args.gid < 0 or not address or not os.path.isabs(args.efs):
        p.error("--uid and --gid must be >= 0, --efs absolute, and this node's address "
                "known (--address)")
    ranks = find_ranks(f"{userfiles.user_name(args.uid)}/{args.job_id}", address, args.uid)
    if not ranks:
        print(f"no rank of job {args.job_id} (uid {args.uid}) on {address}", flush=True)
    jpaths = ClusterPaths(args.efs).job(args.job_id, userfiles.user_name(args.uid))
    for rank, pid in sorted(ranks.items()):
        found = dump(pid, timeout=args.timeout)  # as root: py-spy needs ptrace
        rec = RankStack(rank=rank, address=address, pid=pid, stack=found["stack"],
                        signature=found["signature"], error=found["error"])
        written, error = True, found["error"]
        try:
            with userfiles.as_user(args.uid, args.gid):  # the user's directory, as the user
                store.atomic_write(jpaths.stack(rank), rec.to_json(), mode=0o600)
        except OSError as exc:
            written, error = False, f"cannot write {jpaths.stack(rank)}: {exc}"
        print(MARKER + json.dumps({"rank": rank, "pid": pid, "written": written,
                                   "error": error}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
