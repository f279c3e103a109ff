"""The end of a job: ``result.json`` and ``done`` on EFS, one final message, one exit status.

The message names the cause first (the order of ``classify.failing_nodes``: a lost node,
a restarted executor, a killed share, then nodes that failed by themselves in the order
they failed, then those stopped because of it), so the first words on the terminal point
at the node to look at; a ``cause:`` line gives the class the restart policy acts on.
"""

from __future__ import annotations

import contextlib
import re
import signal

from bootstrap_scripts.jobs.engine import checkpoints, image_pull, staging
from bootstrap_scripts.jobs.engine.classify import (
    NETWORK_REASON,
    Failure,
    FailureKind,
    Verdict,
    as_input,
    classify,
    failing_nodes,
    network_error,
)
from bootstrap_scripts.jobs.engine.outcomes import EXIT_FAILED, EXIT_SIGINT, EXIT_SIGTERM, say
from bootstrap_scripts.jobs.engine.userfiles import cancel_text
from bootstrap_scripts.jobs.engine.watch import Watch
from bootstrap_scripts.protocol import store
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


def describe(kind: FailureKind, node: NodeResult, paths: JobPaths) -> str:
    """One failing node, for the final message (the program's own error line when it has
    one: the launcher's report only repeats the exit code)."""
    where = f"node rank {node.rank} ({node.address})"
    if node.returncode is None:
        why = node.reason.removeprefix(f"node {node.rank} ({node.address}): ")
        return f"{where}: {why} (lost)"
    if kind is FailureKind.CANCELLED:
        return f"{where} was stopped ({node.reason}, code {node.returncode})"
    last = last_error_line(paths, node.rank) if kind in (FailureKind.CODE,
                                                          FailureKind.SIGNALLED) else ""
    return f"{where} exited with code {node.returncode}" + (
        f" ({node.reason})" if node.reason else "") + (f": {last}" if last else "")


def node_results(w: Watch) -> list[NodeResult]:
    """Every share's line of the result."""
    results = []
    spec_ranks = {s.rank for s in w.spec.shares}
    for share in w.shares:
        rec = w.exits.get(share.rank)
        rc = rec.returncode if rec else None
        reason = rec.reason if rec else (w.lost.get(share.rank) or
                                         w.left.get(share.rank, "no exit recorded"))
        if rec is not None and rc not in (0, None) and not rec.cancelled and not rec.reason:
            line = last_error_line(w.paths, share.rank)
            if network_error(line):  # the network between the ranks, not their code
                reason = f"{NETWORK_REASON}: {line}"
        results.append(NodeResult(rank=share.rank, address=share.address, returncode=rc,
                                  reason=reason if rc != 0 else "", left=share.rank in w.left,
                                  joined=share.rank not in spec_ranks))
    return results


#: The jobs that make another job's input ready before it runs, by the suffix of their job
#: id (the job's own id plus it), and what each does.
INPUT_STEPS = ((checkpoints.RESTORE_SUFFIX, "restoring its checkpoint"),
               (staging.STAGE_SUFFIX, "staging its data"))


def input_step(job_id: str) -> str:
    """What a job of ``job_id`` does for another job's input ("" for a job of its own)."""
    return next((what for suffix, what in INPUT_STEPS if job_id.endswith(suffix)), "")


def summarize(w: Watch) -> Verdict:
    """Write the job's result and ``done`` marker, say how it went (the cause first, from
    the one classifier), return the verdict."""
    results = node_results(w)
    job_id = w.spec.job_id
    ok_exits = [r for r in results if r.returncode == 0]
    failing = [r for r in results if r.returncode != 0 and not r.left]
    everyone_left = w.spec.elastic and not failing and not ok_exits and not w.signal_received
    status = "succeeded" if not failing and not everyone_left else "failed"
    if w.signal_received or w.user_cancelled:
        status = "cancelled"
    result = JobResult(job_id=job_id, status=status, launcher=w.spec.launcher,
                       elastic=w.spec.elastic, nodes=tuple(results))
    store.write_record(w.paths.result, result)
    with contextlib.suppress(OSError):
        store.atomic_write(w.paths.done, status + "\n")
    if w.user_cancelled and not w.signal_received:
        say(f"job {job_id} cancelled (by its user)")
        return Verdict(job_id, status, EXIT_SIGTERM, classify(result, w.exits))
    if w.signal_received:
        say(f"job {job_id} cancelled ({signal.Signals(w.signal_received).name})")
        code = EXIT_SIGINT if w.signal_received == signal.SIGINT else EXIT_SIGTERM
        return Verdict(job_id, status, code, classify(result, w.exits))
    if everyone_left:
        first = w.shares[0]
        failure = Failure(FailureKind.NODE_LOST, "every node left the job", first.address,
                          rank=first.rank)
        say(f"job {job_id} FAILED: node rank {first.rank} ({first.address}): every node "
            f"left the job (lost)")
        say(f"logs: {w.paths.nodes}")
        return Verdict(job_id, status, EXIT_FAILED, failure)
    # a cancel this runner did not send (a user's, the cost cap's, the controller's)
    outside = "" if w.cancelled_at is not None else \
        (cancel_text(w.paths.cancel) or "").strip()
    failure = classify(result, w.exits, cancelled_by=outside)
    step = input_step(job_id)
    if step:  # a restore or staging job: its failure is the job's input's, not code
        failure = as_input(failure, step)
    if image_pull.is_pull_job(job_id):  # a node that could not pull: the cluster's fault
        pulled = w.spec.shares[0].procs[0].argv[-1] if w.spec.shares else ""
        failure = image_pull.pull_failure(failure, result, w.exits, pulled)
    if failure is not None and failure.kind is FailureKind.CANCELLED:
        say(f"job {job_id} cancelled: {failure.detail}")
        say(f"cause: {failure.failure_class.value} ({failure.kind.value})")
        say(f"logs: {w.paths.nodes}")
        return Verdict(job_id, "cancelled", EXIT_FAILED, failure)
    if failure is None:
        extra = ""
        if w.spec.elastic:
            joined = sum(r.joined for r in results)
            extra = f" ({joined} joined, {len(w.left)} left while it ran)"
        say(f"job {job_id} succeeded on {len(ok_exits)} node(s){extra}")
        return Verdict(job_id, status, 0)
    lines = [describe(kind, node, w.paths)
             for kind, node in failing_nodes(result, w.exits)]
    if image_pull.is_pull_job(job_id):  # each node's cause (its own line is above)
        lines = [failure.detail]
    say(f"job {job_id} FAILED: " + "; ".join(lines))
    say(f"cause: {failure.failure_class.value} ({failure.kind.value})")
    say(f"logs: {w.paths.nodes}")
    return Verdict(job_id, status, EXIT_FAILED, failure)
