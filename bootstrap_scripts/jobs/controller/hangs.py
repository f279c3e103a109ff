"""Watching a running attempt's progress: hangs (stacks dumped, attempt stopped) and stragglers.

While an attempt runs, :class:`HangWatch` reads every rank's progress file
(``jobs/<id>.<n>/progress/<rank>.json``, the user's, read as the user without following
links) and notes, on the controller's clock, when each rank's step last moved. The rules
are ``engine.hang_rules`` (pure). When no rank moved for the job's ``--hang-timeout``:

1. every rank's Python stack, ``py-spy dump`` as root on the node that hosts it
   (``ops.hang_stacks``, an ``each`` job through the executors);
2. the ranks (and nodes) not where the others are (``hang_rules.odd_ranks``);
3. ``managed/<id>/attempts/<n>.hang.json`` (``HangReport``), written as the user;
4. the attempt's cancel file: its runner stops every share, and the controller records a
   ``hang`` restart under the job's restart policy; the health gate runs before the next
   attempt, as before every attempt, and leaves out a node whose checks or all-reduce fail.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from bootstrap_scripts.jobs.engine import hang_rules, userfiles
from bootstrap_scripts.jobs.engine.classify import Failure, FailureKind
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.errors import ProtocolError
from bootstrap_scripts.protocol.managed_records import HangReport, RankStack
from bootstrap_scripts.protocol.membership import Membership
from bootstrap_scripts.protocol.paths import JobPaths
from bootstrap_scripts.protocol.records import RankProgress

LOG = logging.getLogger("dl-controller")
#: Progress files read per pass at most (a rank per file; more is not a job's).
MAX_RANK_FILES = 4096
#: ``dump(membership, attempt job id, uid)`` -> ({rank: stack record}, dump job id)
NO_STACK = ("no stack: the rank's process was not found on any node (or its node did not "
            "answer)")
Dumper = Callable[[Membership, str, int], tuple[dict[int, dict], str]]


#: No progress on any rank for this long shows in the job's record (``ManagedJob.stalled``,
#: ``dl-jobs``) even without ``--hang-timeout``: a partition or a deadlock is seen while it
#: lasts, not only when the attempt ends.
STALL_SECONDS = 300.0


class HangWatch:
    """One attempt's progress as the controller saw it."""

    def __init__(self, jpaths: JobPaths, *, uid: int, gid: int, hang_timeout: float,
                 clock: Callable[[], float] = time.time) -> None:
        self.jpaths, self.uid, self.gid = jpaths, uid, gid
        self.hang_timeout, self.clock = hang_timeout, clock
        self.records: dict[int, RankProgress] = {}
        self.moved_at: dict[int, float] = {}
        #: when the attempt's processes were last replaced (None: never; see restart_clock)
        self.restarted_at: float | None = None
        #: (host, pid) of the processes replaced since the attempt started
        self.replaced: set[tuple[str, int]] = set()

    def read(self) -> None:
        """Read every rank's progress file; note when a rank's step changed."""
        directory = self.jpaths.progress_dir
        now = self.clock()
        try:
            with userfiles.as_user(self.uid, self.gid):  # the user's files, as the user
                names = sorted(os.listdir(directory))[:MAX_RANK_FILES]
                for name in names:
                    stem, _dot, ext = name.partition(".")
                    if ext != "json" or not stem.isdigit():
                        continue
                    try:
                        rec = RankProgress.from_json(
                            userfiles.read_owned(directory, name).text, source=name)
                    except (OSError, ProtocolError, UnicodeDecodeError):
                        continue
                    if rec.rank != int(stem):
                        continue  # a file must speak for its own rank
                    if self.restarted_at is not None and rec.time < self.restarted_at:
                        continue  # the replaced processes' last report, not the new ones'
                    if rec.pid and (rec.host, rec.pid) in self.replaced:
                        continue  # a replaced process's report at its exit (atexit)
                    old = self.records.get(rec.rank)
                    if old is None or old.step != rec.step:
                        self.moved_at[rec.rank] = now
                    self.records[rec.rank] = rec
        except (FileNotFoundError, NotADirectoryError):
            return  # nobody reported yet
        except OSError as exc:
            LOG.debug("progress of %s unreadable: %s", self.jpaths.job_id, exc)

    def restart_clock(self) -> None:
        """Every rank's process is being replaced: an elastic attempt's membership changed
        (torchrun restarts the workers after a node is lost and after one joins), so no step
        is due before the new processes started. The old processes' reports are forgotten
        (and files written before now are not read again, nor what a replaced process
        writes as it exits: its host and pid); the hang timeout counts from
        the new processes' first report, their start-up being bounded apart
        (``hang_rules.RESTART_GRACE_FACTOR`` timeouts): on two cores torchrun's restart
        alone took longer than a 10 s timeout, and every join was judged a hang."""
        self.restarted_at = self.clock()
        self.replaced |= {(r.host, r.pid) for r in self.records.values() if r.pid}
        self.records.clear()
        self.moved_at.clear()

    def read_stacks(self, found: dict[int, dict]) -> dict[int, dict]:
        """The stacks the nodes wrote (as the user, ``jobs/<id>/stacks/<rank>.json``) for
        the ranks they said they found; where the rank ran and its pid from what the nodes
        said (root's), the stack from the file (the user's)."""
        stacks: dict[int, dict] = {}
        with userfiles.as_user(self.uid, self.gid):  # the user's files, as the user
            for rank, said in found.items():
                item = {"pid": said.get("pid", 0), "address": said.get("address", ""),
                        "stack": "", "signature": "", "error": str(said.get("error", ""))}
                try:
                    rec = RankStack.from_json(userfiles.read_owned(
                        self.jpaths.stacks_dir, self.jpaths.stack(rank).name).text)
                except (OSError, ProtocolError, UnicodeDecodeError) as exc:
                    item["error"] = item["error"] or f"no stack file: {exc}"
                else:
                    if rec.rank == rank:
                        item.update(stack=rec.stack, signature=rec.signature,
                                    error=rec.error)
                stacks[rank] = item
        return stacks

    def steps(self) -> dict[int, int | None]:
        return {r: rec.step for r, rec in self.records.items()}

    def check(self, ranks: int = 0) -> hang_rules.Hang | None:
        """A hang, judged now (None: progress is recent, or none ever reported)."""
        self.read()
        return hang_rules.judge_hang(self.steps(), self.moved_at, now=self.clock(),
                                     timeout=self.hang_timeout, ranks=ranks,
                                     restarted_at=self.restarted_at)

    def stall(self, after: float = STALL_SECONDS) -> str:
        """The record's ``stalled`` line from the last read: no rank's step moved for
        ``after`` s or more ("" otherwise; in whole minutes, so it changes once a minute)."""
        found = hang_rules.judge_hang(self.steps(), self.moved_at, now=self.clock(),
                                      timeout=after, restarted_at=self.restarted_at)
        if found is None:
            return ""
        return f"no progress on any rank for {int(found.seconds // 60)} min"

    def stragglers(self) -> tuple[str, ...]:
        """``dl-jobs``' lines for the ranks that lag the others (from the last read)."""
        found = hang_rules.stragglers(hang_rules.comparable_step_times(
            {r: (rec.recent_step_seconds, rec.recent_compute_seconds)
             for r, rec in self.records.items()}))
        return tuple(f"rank {s.rank} on {self.records[s.rank].host or '?'}: "
                     f"{s.step_seconds:.3g} s/step, {s.ratio:.1f}x the others' "
                     f"{s.reference:.3g} s" for s in found)

    def report(self, hang: hang_rules.Hang, *, attempt: int, stacks: dict[int, dict],
               detected_at: float) -> HangReport:
        """The hang's record: every rank's step and stack, the odd ones named."""
        steps = self.steps()
        signatures = {r: str(s.get("signature", "")) for r, s in stacks.items()}
        everyone = {*steps, *stacks, *hang.behind}
        odd = hang_rules.odd_ranks({r: steps.get(r) for r in everyone}, signatures)
        last_at = max((rec.time for rec in self.records.values()), default=0.0)
        ranks = []
        for r in sorted(everyone):
            s, rec = stacks.get(r, {}), self.records.get(r)
            ranks.append(RankStack(
                rank=r, address=str(s.get("address", "")), pid=int(s.get("pid") or 0),
                step=steps.get(r),
                seconds_since_progress=round(detected_at - rec.time, 2) if rec else None,
                stack=str(s.get("stack", "")), signature=signatures.get(r, ""),
                error=str(s.get("error", "")) if s else NO_STACK, odd=r in odd))
        addresses = tuple(dict.fromkeys(x.address for x in ranks if x.odd and x.address))
        reason = (f"no progress on any rank for {hang.seconds:.0f} s (--hang-timeout "
                  f"{self.hang_timeout:g}); top step {hang.top_step}; "
                  + (f"not where the others are: rank(s) {', '.join(map(str, odd))}"
                     + (f" on {', '.join(addresses)}" if addresses else "")
                     if odd else "every rank at the same place"))
        return HangReport(attempt=attempt, detected_at=detected_at,
                          last_progress_at=last_at, hang_timeout=self.hang_timeout,
                          ranks=tuple(ranks), odd_ranks=odd, odd_addresses=addresses,
                          reason=reason)


def handle(watch: HangWatch, hang: hang_rules.Hang, *, attempt: int, m: Membership | None,
           dump: Dumper, report_path: Path) -> tuple[Failure, HangReport]:
    """Dump the stacks, write the report, stop the attempt; the ``hang`` failure to restart
    on. A dump that fails still leaves a report (without stacks) and stops the attempt."""
    stacks: dict[int, dict] = {}
    if m is not None:
        try:
            found, dump_job = dump(m, watch.jpaths.job_id, watch.uid, watch.gid)
            stacks = watch.read_stacks(found)
            LOG.info("job %s: stacks dumped by %s (%d rank(s))", watch.jpaths.job_id,
                     dump_job, len(stacks))
        except Exception as exc:  # the hang is handled whatever the dump did
            LOG.error("job %s: dumping the stacks failed: %s", watch.jpaths.job_id, exc)
    rep = watch.report(hang, attempt=attempt, stacks=stacks, detected_at=time.time())
    with userfiles.as_user(watch.uid, watch.gid):  # the user's directories, as the user
        try:
            store.atomic_write(report_path, rep.to_json(), mode=0o600)
        except OSError as exc:
            LOG.error("cannot write %s: %s", report_path, exc)
        store.atomic_write(watch.jpaths.cancel,
                           f"{hang_rules.HANG_CANCEL_PREFIX}{rep.reason}\n")
    first = next((x for x in rep.ranks if x.odd), None)
    failure = Failure(FailureKind.HANG, rep.reason, address=first.address if first else "",
                      rank=first.rank if first else None)
    return failure, rep
