"""The fault drills' table and the invariants every row is checked against.

A drill injects one fault into real processes (the emulated cluster's executors, its job
controller, a master agent, a job's shares), reads what the product did from its own records
(``managed/<id>/job.json``, ``jobs/<id>.<n>/``, the agents' logs, the dead-letter queue) and
adds one :class:`Row`. Rows are never asserted where they are made: ``test_zz_table.py``
prints the whole table, then fails if any row did, so every row is seen.

The invariants, as each drill uses them:

- *record*: the job's record says what happened (its state matches the outcome, the reason
  or restart kind is recorded);
- *once*: the job's completion line (``COMPLETE rank=0``) appears exactly once across all
  its attempts (0 times for a job that must not complete);
- *lines*: every rank printed lines ``0..N-1``; after a re-attach each exactly once in the
  one attempt; across a restart each at least once, the restarted attempt starting at its
  checkpoint (so at most one line per rank per restart is repeated);
- *nothing left*: no live process of the job's shares, no wrapper status file of the job on
  any node, no ``*.tmp`` file in its directories, and no new ``/tmp/torchelastic_*``.
"""

from __future__ import annotations

import contextlib
import glob
import re
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bootstrap_scripts.node.procgroup import alive, pids_in_groups, pids_with_token, share_token
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.managed_records import ManagedJob
from bootstrap_scripts.protocol.paths import SHARE_STARTED_SUFFIX, ClusterPaths, JobPaths
from bootstrap_scripts.protocol.records import ShareStarted

JOB = str(Path(__file__).parent / "jobs" / "numbered.py")
LINE_RE = re.compile(r"^line rank=(\d+) n=(\d+) attempt=(\d+)$", re.M)
COMPLETE_RE = re.compile(r"^COMPLETE rank=0 ", re.M)


@dataclass
class Check:
    name: str
    ok: bool
    detail: str = ""


@dataclass
class Row:
    drill: str
    fault: str
    did: str = ""
    seconds: float | None = None
    checks: list[Check] = field(default_factory=list)
    error: str = ""

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.checks.append(Check(name, bool(ok), detail))
        return bool(ok)

    @property
    def passed(self) -> bool:
        return not self.error and bool(self.checks) and all(c.ok for c in self.checks)


ROWS: list[Row] = []


@contextlib.contextmanager
def drill(name: str, fault: str, *, defer: bool = False) -> Iterator[Row]:
    """One row: whatever the drill's body raises makes the row FAIL (with the error) and
    is raised again; a broken invariant fails the drill's test after its row is complete
    (``defer``: when the test calls :func:`assert_passed`, for a test making several rows)."""
    row = Row(name, fault)
    ROWS.append(row)
    try:
        yield row
    except BaseException as exc:
        row.error = f"{type(exc).__name__}: {str(exc)[:300]}"
        traceback.print_exc()
        raise
    if not defer:
        assert_passed(row)


def assert_passed(*rows: Row) -> None:
    broken = [f"{r.drill}: {c.name}: {c.detail}" for r in rows for c in r.checks if not c.ok]
    assert all(r.checks for r in rows) and not broken, f"invariants broken: {broken}"


def wait_for(what: str, check: Callable, timeout: float = 120, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


# -- reading what the product did ----------------------------------------------------------


def record(efs: Path, job_id: str) -> ManagedJob | None:
    return store.read_record_or_none(ClusterPaths(efs).managed(job_id).record, ManagedJob)


def attempts(efs: Path, job_id: str) -> list[JobPaths]:
    """``jobs/<user>/<id>.<n>/`` of every attempt there is, in order."""
    jobs = ClusterPaths(efs).job(job_id).dir.parent
    found = [(int(d.name.rpartition(".")[2]), d) for d in jobs.glob(f"{job_id}.*")
             if d.is_dir() and d.name.rpartition(".")[2].isdigit()]
    return [JobPaths(d) for _, d in sorted(found)]


def logs(efs: Path, job_id: str, ranks: int) -> list[list[str]]:
    """Every attempt's log text per rank."""
    return [[store.read_text(a.log(r)) or "" for r in range(ranks)] for a in attempts(efs, job_id)]


def completions(efs: Path, job_id: str, ranks: int) -> int:
    return sum(len(COMPLETE_RE.findall(text)) for per in logs(efs, job_id, ranks)
               for text in per)


def line_numbers(text: str) -> list[int]:
    return [int(m.group(2)) for m in LINE_RE.finditer(text)]


def lines_ok(efs: Path, job_id: str, ranks: int, n: int, *, reattached: bool) -> tuple[bool, str]:
    """The *lines* invariant (module docstring): (ok, what was found)."""
    per_attempt = logs(efs, job_id, ranks)
    if not per_attempt:
        return False, "no attempt directory"
    problems: list[str] = []
    for r in range(ranks):
        seqs = [line_numbers(per[r]) for per in per_attempt]
        if reattached:
            if len(seqs) != 1 or seqs[0] != list(range(n)):
                problems.append(f"rank {r}: {[len(s) for s in seqs]} lines in "
                                f"{len(seqs)} attempt(s), want 0..{n - 1} once")
            continue
        seen = sorted(set().union(*map(set, seqs)))
        last = seqs[-1]
        repeated = sum(len(s) for s in seqs) - len(seen)
        if seen != list(range(n)):
            problems.append(f"rank {r}: lines missing {sorted(set(range(n)) - set(seen))}")
        elif not last or last != list(range(last[0], n)):
            problems.append(f"rank {r}: the last attempt is not a run to the end: {last[:3]}..")
        elif repeated > len(seqs) - 1:
            problems.append(f"rank {r}: {repeated} line(s) repeated over {len(seqs) - 1} "
                            f"restart(s)")
    total = sum(len(line_numbers(t)) for per in per_attempt for t in per)
    return not problems, "; ".join(problems) or (
        f"{ranks}x{n} lines, {total} printed over {len(per_attempt)} attempt(s)")


def torchelastic_dirs() -> set[str]:
    return set(glob.glob("/tmp/torchelastic_*"))


def leftovers(efs: Path, job_id: str, node_roots: dict[str, Path],
              status_dir: Callable[[Path], Path], elastic_before: set[str], *,
              owners: set[int] | None = None) -> list[str]:
    """The *nothing left* invariant: what the job left behind (empty when nothing).
    ``owners``: the uids the job's processes ran as; a new ``/tmp/torchelastic_*`` of any
    other user is another run's on this machine (``make test`` beside ``make chaos``)."""
    left: list[str] = []
    for a in attempts(efs, job_id):
        groups: set[int] = set()
        tokens: list[str] = []
        for _stem, rec in store.scan_records(a.nodes, ShareStarted, suffix=SHARE_STARTED_SUFFIX):
            groups.add(rec.pgid)
            tokens.append(share_token(a.key, rec.rank, rec.address))
        pids = pids_in_groups(g for g in groups if g) | {
            p for t in tokens for p in pids_with_token(t) if alive(p)}
        if pids:
            left.append(f"{a.job_id}: live pids {sorted(pids)}")
        left += [f"tmp file {p}" for p in a.dir.rglob("*.tmp")]
        for address, root in node_roots.items():
            left += [f"{address}: status file {p.name}"
                     for p in status_dir(root).glob(f"{a.job_id}.*")]
    new = {d for d in torchelastic_dirs() - elastic_before
           if owners is None or _owner(d) in owners}
    left += [f"new {d}" for d in sorted(new)]
    return left


def _owner(path: str) -> int | None:
    try:
        return Path(path).stat().st_uid
    except OSError:
        return None


# -- the table -----------------------------------------------------------------------------


def _cell(text: str) -> str:
    return text.replace("|", "/").replace("\n", " ")


def table(rows: list[Row]) -> str:
    """The rows as a Markdown table (as README.md shows it)."""
    out = ["| drill | fault injected | what the product did | fault → running again "
           "(or refusal) | invariants checked | result |", "|---|---|---|---|---|---|"]
    for row in rows:
        secs = "-" if row.seconds is None else f"{row.seconds:.1f} s"
        checks = "; ".join(f"{c.name} {'ok' if c.ok else 'BROKEN'}"
                           + (f" ({c.detail})" if c.detail and not c.ok else "")
                           for c in row.checks)
        if row.error:
            checks = (checks + "; " if checks else "") + f"drill error: {row.error}"
        out.append(f"| {_cell(row.drill)} | {_cell(row.fault)} | {_cell(row.did)} | {secs} | "
                   f"{_cell(checks)} | {'PASS' if row.passed else 'FAIL'} |")
    return "\n".join(out)
