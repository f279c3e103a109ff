"""Every rank's Python stack of a hung attempt, dumped as root on the node that hosts it.

    found, dump_job = dump_stacks(root, efs, membership, job_id="<id>.<n>", uid=..., gid=...)
    found[rank] -> {"rank", "pid", "address", "written", "error"}

The job controller calls it when an attempt made no progress for ``--hang-timeout``. It
runs ``ops.stack_dump`` on each of the attempt's nodes as one ``each`` job through the job
executors (no ssh anywhere), exactly as the health gate runs its checks (``ops.gate``'s
``GateJob``): the controller is root, so the executors run the dump as root, which
``py-spy dump`` needs to read another process's memory. Each node writes its ranks' stacks
as the job's user into the attempt's ``stacks/<rank>.json`` and prints one ``DL-STACK``
line per rank (no stack in it: this job's log is root's); a node that does not answer
within ``timeout`` simply has no line (its ranks show "no stack" in the report).
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from bootstrap_scripts.ops.gate import GateJob
from bootstrap_scripts.ops.gate_report import GateSettings
from bootstrap_scripts.ops.stack_dump import MARKER
from bootstrap_scripts.protocol import record_base, store
from bootstrap_scripts.protocol.errors import ProtocolError
from bootstrap_scripts.protocol.membership import Membership

DEFAULT_TIMEOUT = 45.0
POLL_SECONDS = 0.2


def parse_stacks(text: str) -> list[dict]:
    """The ``DL-STACK`` records of one share's log, malformed lines skipped."""
    found = []
    for line in text.splitlines():
        i = line.find(MARKER)
        if i < 0:
            continue
        with contextlib.suppress(ValueError):
            item = record_base.loads(line[i + len(MARKER):])
            if isinstance(item, dict) and isinstance(item.get("rank"), int):
                found.append(item)
    return found


def dump_stacks(root: Path, efs: Path, m: Membership, *, job_id: str, uid: int, gid: int,
                timeout: float = DEFAULT_TIMEOUT, python: str = "") -> tuple[dict[int, dict], str]:
    """({rank: what its node said}, the dump job's id) for the ranks on ``m``'s nodes."""
    settings = GateSettings(python=python)
    job = GateJob("stacks", root, efs, m, list(m.nodes), settings, timeout)
    per_process = max(5.0, timeout / 3)
    command = ["python", "-m", "bootstrap_scripts.ops.stack_dump", "--efs", str(efs),
               "--job-id", job_id, "--uid", str(uid), "--gid", str(gid),
               "--timeout", f"{per_process:g}"]
    deadline = time.monotonic() + timeout
    finished = False
    try:
        job.start("each", command)
        while time.monotonic() < deadline:
            job.poll()
            if all(s.exit is not None for s in job.shares.values()):
                finished = True
                break
            if job.runner_done() and not store.exists(job.paths.spec):
                break  # the runner failed before publishing: nothing will come
            time.sleep(POLL_SECONDS)
        stacks: dict[int, dict] = {}
        for share in job.shares.values():
            try:
                log = store.read_text(job.paths.log(share.rank), errors="replace") or ""
            except (OSError, ProtocolError):  # no regular file of text, or too large
                log = ""
            for item in parse_stacks(log):
                item["address"] = share.node.address
                stacks.setdefault(item["rank"], item)
    finally:
        job.stop(finishing=finished)
    return stacks, job.job_id
