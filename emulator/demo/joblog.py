"""What the demo reads from a training job: the lines ``dl-run`` prints and the share
records the executors leave under the job's directory on EFS.

The line formats are the example job's (``bootstrap_scripts.examples.train_digits``), as
``dl-run`` relays them with a ``[<rank> <address>]`` prefix::

    [dl-run] job <job-id>
    [0 127.20.0.5] start world_size=3 restart=0 step=0
    [2 127.20.128.7] first_step rank=2 world_size=3
    [0 127.20.0.5] epoch=1 acc=0.912 loss=0.3120 samples_per_s=5012 world_size=3
    [0 127.20.0.5] final acc=0.968 world_size=3
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.managed_records import ManagedJob
from bootstrap_scripts.protocol.paths import ClusterPaths, JobPaths, ManagedPaths, validate_job_id
from bootstrap_scripts.protocol.records import ShareStarted

EPOCH_RE = re.compile(r"^\[(\d+) (\S+)\] epoch=(\d+) acc=([\d.]+) loss=([\d.]+) "
                      r"samples_per_s=(\d+) world_size=(\d+)")
FINAL_RE = re.compile(r"^\[(\d+) (\S+)\] final acc=([\d.]+) world_size=(\d+)")
JOB_RE = re.compile(r"\[dl-run\] job (\S+)$")
#: ``dl-run`` of a managed job: the id the job controller knows it by (``dl-jobs``).
SUBMITTED_RE = re.compile(r"\[dl-run\] job (\S+) submitted")
#: The follower's line between two attempts of a managed job (``jobs/cli/follow.py``).
RESTART_RE = re.compile(r"^(?:\[dl-run\] )?---- restart (\d+) of job (\S+) after attempt "
                        r"(\d+): (\S+)")
START_RE = re.compile(r"^\[(\d+) (\S+)\] start world_size=(\d+) restart=(\d+) step=(\d+)")
FIRST_STEP_RE = re.compile(r"^\[(\d+) (\S+)\] first_step rank=(\d+) world_size=(\d+)")
#: Words that make a ``[dl-run]`` line worth showing (the runner's verdicts and failures).
RUNNER_WORDS = ("FAILED", "error", "succeeded", "stopping", "exited")
#: Lines of the job's own output shown dimmed (resumption, tracebacks).
DETAIL_WORDS = ("resumed from", "Traceback", "Error")
#: A Python exception's own line (``RuntimeError: ...``, ``torch.distributed.DistNetworkError:
#: ...``) after an optional ``[<rank> <where>]`` label: the line a failure's story starts at,
#: even when dozens of C++ frames follow it.
EXCEPTION_RE = re.compile(r"^(?:\[[^\]]*\]\s*)?(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*"
                          r"(?:Error|Exception)(?::\s.*)?$")
#: Exceptions that only report another's failure (torchrun's summary of a failed child).
WRAPPER_EXCEPTIONS = ("ChildFailedError",)
#: Of those, the ones always shown at once; the others (errors) are held back until it is known
#: whether the attempt they belong to was restarted (see :meth:`JobRun.hold_error`).
SHOWN_AT_ONCE = ("resumed from",)


@dataclass
class JobRun:
    """One ``dl-run`` invocation as the demo followed it."""

    job_id: str = ""
    exit_code: int | None = None
    resumed: bool = False
    epochs: list[dict] = field(default_factory=list)
    final_acc: float | None = None
    world_size: int = 0
    seconds: float = 0.0
    failure: str = ""
    killed: dict | None = None
    output_tail: list[str] = field(default_factory=list)
    #: a managed job: its id with the controller, the restart lines seen (each with the
    #: time it was seen), and the controller's record (``dl-jobs show ID --json``)
    managed_id: str = ""
    restart_lines: list[dict] = field(default_factory=list)
    record: dict | None = None
    #: error lines of the current attempt not shown yet: when a node is lost its peers die
    #: with gloo / ``c10::Error`` tracebacks that say nothing the restart line does not
    held_errors: list[str] = field(default_factory=list)

    def hold_error(self, line: str) -> None:
        self.held_errors.append(line)

    def release_errors(self) -> list[str]:
        """The held error lines, forgotten here."""
        held, self.held_errors = self.held_errors, []
        return held
    how: str = "dl-run"  # or "dl-jobs logs -f" (re-attached)
    #: the first exception line of the job's output (``EXCEPTION_RE``), whatever followed it
    first_exception: str = ""

    def to_dict(self) -> dict:
        return {"job_id": self.job_id, "exit_code": self.exit_code, "resumed": self.resumed,
                "world_size": self.world_size, "final_acc": self.final_acc,
                "seconds": round(self.seconds, 2), "failure": self.failure,
                "killed": self.killed, "epochs": self.epochs, "how": self.how,
                "managed_id": self.managed_id,
                "state": (self.record or {}).get("state"),
                "restarts": list((self.record or {}).get("restart_log", ()))}

    def keep_line(self, line: str) -> None:
        """Remember the last 40 lines and the first exception line (for failure messages)."""
        self.output_tail = [*self.output_tail, line][-40:]
        if not self.first_exception and EXCEPTION_RE.match(line) \
                and not any(w in line for w in WRAPPER_EXCEPTIONS):
            self.first_exception = line

    def finish(self, exit_code: int, seconds: float) -> None:
        self.exit_code = exit_code
        self.seconds = seconds
        self.failure = failure_line(self.output_tail)

    def names_node(self, address: str) -> bool:
        """Did the runner's own output name the node at ``address`` (e.g. as the lost one)?"""
        return any(address in ln for ln in self.output_tail if "[dl-run]" in ln)


@dataclass(frozen=True)
class WorkerStart:
    """A worker process (re)started: ``world_size`` nodes, resuming at ``step``."""

    address: str
    world_size: int
    restart: int
    step: int


@dataclass(frozen=True)
class FirstStep:
    """The worker on ``address`` took its first training step."""

    address: str
    rank: int
    world_size: int


def attempt_job_id(paths: ClusterPaths, job: JobRun) -> str:
    """The id of the job directory (``jobs/<id>/``) that holds ``job``'s node logs: for a
    managed job its latest attempt's (``<id>.<n>``, from the controller's record), else its
    own. "" while a managed job has not started an attempt."""
    if not job.managed_id:
        return job.job_id
    managed = ManagedPaths(locate(paths, job.managed_id, managed=True))
    rec = store.read_record_or_none(managed.record, ManagedJob)
    return managed.attempt_id(rec.attempt) if rec is not None and rec.attempt else ""


def job_id(line: str) -> str | None:
    m = JOB_RE.search(line)
    return m.group(1) if m else None


def submitted(line: str) -> str | None:
    """The managed job's id, from ``dl-run``'s "job <id> submitted" line."""
    m = SUBMITTED_RE.search(line)
    return m.group(1) if m else None


def restart(line: str) -> dict | None:
    """The follower's restart line: restart number, attempt that failed, kind."""
    m = RESTART_RE.match(line)
    if not m:
        return None
    return {"restart": int(m.group(1)), "job_id": m.group(2), "attempt": int(m.group(3)),
            "kind": m.group(4).rstrip(":")}


def epoch(line: str) -> dict | None:
    """An epoch line as the report records it."""
    m = EPOCH_RE.match(line)
    if not m:
        return None
    return {"epoch": int(m.group(3)), "acc": float(m.group(4)), "loss": float(m.group(5)),
            "samples_per_s": int(m.group(6)), "world_size": int(m.group(7))}


def final_acc(line: str) -> float | None:
    m = FINAL_RE.match(line)
    return float(m.group(3)) if m else None


def worker_start(line: str) -> WorkerStart | None:
    m = START_RE.match(line)
    if not m:
        return None
    return WorkerStart(m.group(2), int(m.group(3)), int(m.group(4)), int(m.group(5)))


def first_step(line: str) -> FirstStep | None:
    m = FIRST_STEP_RE.match(line)
    if not m:
        return None
    return FirstStep(m.group(2), int(m.group(3)), int(m.group(4)))


def is_runner_notice(line: str) -> bool:
    return line.startswith("[dl-run]") and any(w in line for w in RUNNER_WORDS)


def is_detail(line: str) -> bool:
    return any(w in line for w in DETAIL_WORDS)


def failure_line(lines: list[str]) -> str:
    """The last line that says FAILED, or ""."""
    failed = [ln for ln in lines if "FAILED" in ln]
    return failed[-1] if failed else ""


def failure_cause(lines: list[str], first_exception: str = "") -> str:
    """Why the job failed, in the runner's words: its verdict without the ``[dl-run] job <id>
    FAILED:`` prefix (the failing node first, with its own last error line), else the
    runner's last ``error:`` line (a job that never started), else the output's first
    exception line (a job no dl-run ran, e.g. Slurm's), else ""."""
    verdict = failure_line([ln for ln in lines if ln.startswith("[dl-run]")])
    if verdict:
        return verdict.split("FAILED:", 1)[1].strip()
    errors = [ln for ln in lines if ln.startswith("[dl-run] error:")]
    return errors[-1].removeprefix("[dl-run] ").strip() if errors else first_exception


# -- the job's share records on EFS ----------------------------------------------------------


def shares(job: JobPaths) -> list[ShareStarted]:
    """Every share of ``job`` an executor acknowledged (``nodes/<rank>.started``)."""
    suffix = job.started(0).suffix  # the acknowledgement's suffix, whatever the rank
    return [rec for _, rec in store.scan_records(job.nodes, ShareStarted, suffix=suffix)]


def share_groups(efs: str | os.PathLike) -> list[int]:
    """The process group of every share of every job on this EFS."""
    jobs_dir = ClusterPaths(efs).jobs_dir
    dirs = sorted(p for p in jobs_dir.glob("*/*") if p.is_dir() and not p.is_symlink())
    return [rec.pgid for d in dirs for rec in shares(JobPaths(d)) if rec.pgid]


def locate(paths: ClusterPaths, job_id: str, *, managed: bool = False) -> Path:
    """The directory of the job ``job_id`` (a bare id, as the demo's commands print it)
    whoever's it is (``jobs/<user>/<id>/``, ``managed/<user>/<id>/``): the first user's
    who has one, else the demo's own user's."""
    top = paths.managed_dir if managed else paths.jobs_dir
    found = sorted(p for p in top.glob(f"*/{validate_job_id(job_id)}") if p.is_dir())
    return found[0] if found else (paths.managed(job_id).dir if managed
                                   else paths.job(job_id).dir)


def share_groups_of(efs: str | os.PathLike, job: str, address: str) -> list[int]:
    """The process groups of job ``job``'s shares on the node at ``address``."""
    if not job:
        return []
    return [rec.pgid for rec in shares(JobPaths(locate(ClusterPaths(efs), job)))
            if rec.address == address and rec.pgid]
