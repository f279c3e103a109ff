"""``dlc jobs`` and ``dlc logs -f`` over the operator channel, in process: a stand-in for Run
Command that runs the master's real ``dl-jobs`` on a temp EFS and returns what
GetCommandInvocation would (stdout cut at its 24,000 characters), so the listing's pages
and the follow loop's ending are the product's own code on both sides."""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

import pytest

from bootstrap_scripts.jobs.cli import dl_jobs
from bootstrap_scripts.jobs.engine import managed
from bootstrap_scripts.protocol.managed_records import ManagedJob, ManagedRequest
from bootstrap_scripts.protocol.paths import ClusterPaths
from bootstrap_scripts.protocol.run_request import RunRequest
from dlc import cli
from dlc import jobs as jobs_mod
from dlc.errors import DlcError
from dlc.remote import STDOUT_LIMIT, Remote, Result
from emulator.ssm_agent import STDOUT_LIMIT as EMULATED_LIMIT


class Master(Remote):
    """The master's ``dl-jobs`` run in this process on ``efs``; ``between`` is called after
    every command (a user acting meanwhile)."""

    def __init__(self, efs: Path, between=lambda n: None) -> None:
        super().__init__(None, "i-master", document="any-user")  # type: ignore[arg-type]
        self.efs, self.between, self.calls = efs, between, 0

    def run(self, argv: list[str], **_kw) -> Result:
        assert argv[0] == "dl-jobs", argv
        raw = io.BytesIO()  # dl-jobs writes pages to stdout's bytes
        out, err = io.TextIOWrapper(raw, encoding="utf-8"), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = dl_jobs.main(["--mount-point", str(self.efs), *argv[1:]])
            except SystemExit as exc:  # argparse's usage error
                code = int(exc.code or 0)
        out.flush()
        self.calls += 1
        self.between(self.calls)
        text = raw.getvalue().decode()
        return Result(code, text[:STDOUT_LIMIT], err.getvalue(), "Success")


def submitted(efs: Path, job_id: str, **record) -> None:
    """A submitted job: its request, and (``record``) the controller's record."""
    paths = ClusterPaths(efs).managed(job_id)
    paths.dir.mkdir(parents=True)
    request = ManagedRequest(job_id=job_id, run=RunRequest(job_id=job_id, command=("true",)),
                             submitted_at=1000.0 + len(list(paths.dir.parent.iterdir())))
    paths.request.write_text(request.to_json())
    if record:
        managed.save_job(paths, ManagedJob(job_id=job_id, submitted_at=request.submitted_at,
                                           **record))


def test_the_emulators_limit_is_run_commands() -> None:
    assert STDOUT_LIMIT == EMULATED_LIMIT == 24_000


def test_dlc_jobs_lists_more_jobs_than_one_run_command_answer_holds(tmp_path: Path) -> None:
    """Forty finished jobs make ``dl-jobs --json`` far longer than Run Command returns:
    read whole it is cut (and dlc says so), read in ``--from`` pages every job is there
    once, in order."""
    for k in range(40):
        submitted(tmp_path, f"job-{k:02d}", state="failed", attempt=1,
                  message=f"job {k} failed: " + "x" * 900)
    master = Master(tmp_path)
    with pytest.raises(DlcError, match="printed more than Run Command returns"):
        master.json(["dl-jobs", "--json"])
    listed = jobs_mod.list_jobs(master)
    assert [j["job_id"] for j in listed] == [f"job-{k:02d}" for k in range(40)]
    assert master.calls >= 1 + 3  # the cut answer, then several pages
    assert all(j["state"] == "failed" and j["cost"] for j in listed)


def test_a_page_holds_at_least_one_job_and_says_whether_more_are_left() -> None:
    entries = [{"job_id": str(k), "pad": "y" * 50} for k in range(10)]
    page, more = dl_jobs.list_page(entries, budget=200)
    assert [e["job_id"] for e in page] == ["0", "1"] and more
    page, more = dl_jobs.list_page(entries[9:], budget=200)
    assert [e["job_id"] for e in page] == ["9"] and not more
    page, more = dl_jobs.list_page(entries, budget=1)  # too big: alone, still moving on
    assert len(page) == 1 and more


def test_an_older_dl_jobs_without_pages_is_read_whole(tmp_path: Path,
                                                      monkeypatch) -> None:
    """A master whose dl-jobs predates ``--from`` is asked for the whole list."""
    submitted(tmp_path, "old-1", state="succeeded", attempt=1)
    real = dl_jobs.parse_args

    def without_from(argv):
        if "--from" in argv:  # what argparse says of an option it does not know
            print("dl-jobs: error: unrecognized arguments: --from 0", file=sys.stderr)
            raise SystemExit(2)
        return real(argv)

    monkeypatch.setattr(dl_jobs, "parse_args", without_from)
    assert [j["job_id"] for j in jobs_mod.list_jobs(Master(tmp_path))] == ["old-1"]


def test_follow_ends_when_a_job_that_never_started_is_cancelled(tmp_path: Path, capsys,
                                                                monkeypatch) -> None:
    """``dlc logs -f`` of a queued job (no controller picks it up here, as when a long job
    holds the cluster): it says once that the job is waiting, and when the user cancels
    it, it ends at once with the job's state and exit status 1."""
    submitted(tmp_path, "stuck-1")  # a request, no record: queued

    def user_cancels(n: int) -> None:
        if n == 3:
            managed.cancel(tmp_path, "stuck-1")
        assert n < 100, "dlc logs -f still following 97 pages after the cancel"

    master = Master(tmp_path, user_cancels)
    monkeypatch.setattr(jobs_mod, "FOLLOW_POLL", 0.01)
    monkeypatch.setattr(cli, "remote_of", lambda ctx: master)
    code = cli.main(["logs", "-f", "stuck-1"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert err.count("dlc: job stuck-1 is queued: waiting for") == 1, err
    assert err.rstrip().endswith("job stuck-1 cancelled"), err
    shown = json.loads(dl_jobs_out(tmp_path, "show", "stuck-1", "--json"))
    assert shown["state"] == "cancelled" and shown["message"] == \
        managed.CANCELLED_BEFORE_START


def test_follow_of_a_queued_job_is_bounded_and_says_so(tmp_path: Path) -> None:
    """The follow loop's own bound (``timeout``): a job that stays queued fails the follow
    with a message naming its state, it does not wait forever."""
    submitted(tmp_path, "stuck-2")
    said: list[str] = []
    with pytest.raises(DlcError, match="job stuck-2 still queued after 0 s of following"):
        jobs_mod.stream_logs(Master(tmp_path), "stuck-2", None, said.append, said.append,
                             follow=True, poll=0.01, timeout=0.05)
    assert sum("is queued: waiting for" in s for s in said) == 1, said


def dl_jobs_out(efs: Path, *argv: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert dl_jobs.main(["--mount-point", str(efs), *argv]) == 0
    return out.getvalue()


def test_a_page_past_the_end_is_empty_and_a_negative_start_is_refused(tmp_path: Path) -> None:
    submitted(tmp_path, "only-1", state="succeeded", attempt=1)
    page = json.loads(dl_jobs_out(tmp_path, "--json", "--from", "5"))
    assert page["jobs"] == [] and page["next"] is None and page["total"] == 1
    res = Master(tmp_path).run(["dl-jobs", "--json", "--from", "-1"])
    assert res.code == 2 and "--from must be >= 0" in res.stderr
