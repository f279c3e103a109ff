"""The end of a job: ``result.json`` and ``done`` on EFS, one final message, one exit status.

The message names the cause first (a lost node, then nodes that failed by themselves in
the order they failed, then those stopped because of it), so the first words on the
terminal point at the node to look at.
"""

from __future__ import annotations

import contextlib
import re
import signal
from dataclasses import dataclass

from bootstrap_scripts.jobs.engine.outcomes import EXIT_FAILED, EXIT_SIGINT, EXIT_SIGTERM, say
from bootstrap_scripts.jobs.engine.watch import Watch
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.jobs import Share
from bootstrap_scripts.protocol.paths import JobPaths
from bootstrap_scripts.protocol.records import JobResult, NodeResult

#: A line a program prints when it gives up: ``error: ...`` or a Python exception's last line
#: (``ValueError: ...``), at the start of the line (log-prefixed lines are a launcher's).
ERROR_LINE_RE = re.compile(r"^(?:(?:error|fatal)\b|[A-Za-z_][\w.]*(?:Error|Exception)\b:)",
                           re.IGNORECASE)
#: The launcher's own report that a child failed: it repeats the exit code, not the cause.
LAUNCHER_ERRORS = ("ChildFailedError",)


def last_error_line(paths: JobPaths, rank: int, max_bytes: int = 65536) -> str:
    """The last error line the share of ``rank`` printed (its log on EFS), or "".

    A launcher (torchrun) ends a failed share with its own report, which only repeats the
    exit code; the line that says why is the program's, so the summary quotes that one."""
    found = ""
    for log in sorted(paths.nodes.glob(f"{rank}.log")) + sorted(paths.nodes.glob(f"{rank}-*.log")):
        with contextlib.suppress(OSError), open(log, "rb") as f:
            f.seek(max(0, log.stat().st_size - max_bytes))
            for line in f.read().decode(errors="replace").splitlines():
                line = line.strip()
                if ERROR_LINE_RE.match(line) and not any(w in line for w in LAUNCHER_ERRORS):
                    found = line
    return found[:300]


@dataclass(frozen=True)
class Failure:
    """One share that did not succeed (and did not leave an elastic job)."""

    share: Share
    returncode: int | None
    reason: str
    cancelled: bool
    lost: bool
    finished_at: float
    last_error: str = ""

    def order(self) -> tuple[bool, bool, float, int]:
        return (not self.lost, self.cancelled, self.finished_at, self.share.rank)

    def describe(self) -> str:
        share = self.share
        node = f"node rank {share.rank} ({share.address})"
        if self.returncode is None:
            return (f"{node}: {self.reason.removeprefix(f'node {share.rank} ({share.address}): ')}"
                    + (" (lost)" if self.lost else ""))
        if self.cancelled:
            return f"{node} was stopped ({self.reason}, code {self.returncode})"
        return f"{node} exited with code {self.returncode}" + (
            f" ({self.reason})" if self.reason else "") + (
            f": {self.last_error}" if self.last_error else "")


def outcome(w: Watch) -> tuple[list[NodeResult], list[Failure]]:
    """Every share's line of the result, and the shares that failed the job."""
    results = []
    failed = []
    spec_ranks = {s.rank for s in w.spec.shares}
    for share in w.shares:
        rec = w.exits.get(share.rank)
        rc = rec.returncode if rec else None
        reason = rec.reason if rec else (w.lost.get(share.rank) or
                                         w.left.get(share.rank, "no exit recorded"))
        left = share.rank in w.left
        results.append(NodeResult(rank=share.rank, address=share.address, returncode=rc,
                                  reason=reason if rc != 0 else "", left=left,
                                  joined=share.rank not in spec_ranks))
        if rc != 0 and not left:
            lost = share.rank in w.lost
            finished = w.lost_at.get(share.rank) if lost else (rec.finished_at if rec else 0.0)
            cancelled = bool(rec and rec.cancelled)
            failed.append(Failure(share, rc, reason, cancelled, lost, float(finished or 0.0),
                                  "" if cancelled or lost else
                                  last_error_line(w.paths, share.rank)))
    return results, failed


def summarize(w: Watch) -> int:
    """Write the job's result and ``done`` marker, say how it went, return the exit status."""
    results, failed = outcome(w)
    ok_exits = [r for r in results if r.returncode == 0]
    if w.spec.elastic and not failed and not ok_exits and not w.signal_received:
        failed = [Failure(s, None, "every node left the job", False, True, 0.0)
                  for s in w.shares[:1]]
    status = "succeeded" if not failed and not w.signal_received else "failed"
    if w.signal_received:
        status = "cancelled"
    store.write_record(w.paths.result, JobResult(
        job_id=w.spec.job_id, status=status, launcher=w.spec.launcher,
        elastic=w.spec.elastic, nodes=tuple(results)))
    with contextlib.suppress(OSError):
        store.atomic_write(w.paths.done, status + "\n")
    if w.signal_received:
        say(f"job {w.spec.job_id} cancelled ({signal.Signals(w.signal_received).name})")
        return EXIT_SIGINT if w.signal_received == signal.SIGINT else EXIT_SIGTERM
    if not failed:
        extra = ""
        if w.spec.elastic:
            joined = sum(r.joined for r in results)
            extra = f" ({joined} joined, {len(w.left)} left while it ran)"
        say(f"job {w.spec.job_id} succeeded on {len(ok_exits)} node(s){extra}")
        return 0
    failed.sort(key=Failure.order)
    say(f"job {w.spec.job_id} FAILED: " + "; ".join(f.describe() for f in failed))
    say(f"logs: {w.paths.nodes}")
    return EXIT_FAILED
