"""The checkpoint mirror reads a checkpoint's bytes from the node-local copy, not back from EFS
(EFS's Elastic throughput bills each GB read): counted, against moto's S3 server over HTTP.

The count: every file the process opens with Python's ``open`` (what boto3's transfer manager
opens an upload's file with) is wrapped, and the bytes read from files under the EFS
directory are added up. The manifests and the mirror's status are read through
``protocol/store.py`` (``os.open``), small and not counted: they are read from EFS in every
case, as the listing is.
"""

from __future__ import annotations

import builtins
import threading
from pathlib import Path

import pytest

from bootstrap_scripts.data import checkpoint_mirror as mirror
from bootstrap_scripts.data import checkpoint_plan as cp
from bootstrap_scripts.jobs.engine import checkpoints as engine
from bootstrap_scripts.protocol.run_request import RunRequest
from tests.data.conftest import S3Env

URL = "s3://training-data/checkpoints/c1/alice/job-1/"
PREFIX = "checkpoints/c1/alice/job-1/"
BODY = bytes(range(256)) * 4096 + b"tail"  # 1 MiB and 4 bytes: more than one read


class Counted:
    """A file object whose reads are added to ``counter`` (everything else passes through)."""

    def __init__(self, f, counter: list[int], lock: threading.Lock) -> None:
        self._f, self._counter, self._lock = f, counter, lock

    def _add(self, n: int) -> None:
        with self._lock:
            self._counter[0] += n

    def read(self, *args):
        data = self._f.read(*args)
        self._add(len(data))
        return data

    def readinto(self, b):
        n = self._f.readinto(b)
        self._add(n or 0)
        return n

    def __iter__(self):
        return iter(self._f)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._f.close()

    def __getattr__(self, name: str):
        return getattr(self._f, name)


@pytest.fixture()
def efs_reads(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """(EFS directory, counter): bytes read from files under the directory, by any thread."""
    efs = tmp_path / "efs" / "checkpoints" / "alice" / "job-1"
    counter, lock = [0], threading.Lock()
    real_open = builtins.open

    def counting_open(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        if isinstance(file, (str, Path)) and "r" in mode and \
                Path(file).resolve().is_relative_to(efs):
            return Counted(f, counter, lock)
        return f

    monkeypatch.setattr(builtins, "open", counting_open)
    return efs, counter


def save(directory: Path, name: str, step: int, body: bytes = BODY,
         written_at: float | None = None) -> cp.Manifest:
    """A checkpoint as a job writes it: the data file, then its manifest last."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.pt").write_bytes(body)
    m = cp.new_manifest(name, step, float(step) if written_at is None else written_at,
                        [(f"{name}.pt", len(body))])
    (directory / m.manifest_file).write_text(m.render())
    return m


def uploaded(env: S3Env, key: str) -> bytes:
    return env.s3.get_object(Bucket=env.bucket, Key=PREFIX + key)["Body"].read()  # type: ignore[attr-defined]


def mirror_as_the_engine_runs_it(env: S3Env, monkeypatch, efs: Path, local: Path | None,
                                 action: str = "once") -> None:
    """The flush job's command line as the engine builds it for a job with (or without)
    ``DL_CHECKPOINT_LOCAL_DIR``, run in this process."""
    monkeypatch.setenv("DL_ROOT", str(env.root))
    job_env = {engine.DIR_VARIABLE: str(efs)}
    if local is not None:
        job_env["DL_CHECKPOINT_LOCAL_DIR"] = str(local)  # as the job sets it
    request = RunRequest(job_id="job-1", command=("python", "t.py"), env=job_env,
                         checkpoint_url=URL)
    argv = engine.tool_argv(action, request)
    assert argv[:3][1:] == ["-m", engine.MODULE]
    assert mirror.main(argv[3:]) == 0


def test_without_a_local_copy_the_mirror_reads_the_checkpoint_back_from_efs(
        s3env: S3Env, efs_reads, monkeypatch) -> None:
    """What every mirrored byte cost before: read once more from EFS (the counter works)."""
    efs, counter = efs_reads
    save(efs, "step-000010", 10)
    mirror_as_the_engine_runs_it(s3env, monkeypatch, efs, None)
    assert uploaded(s3env, "step-000010.pt") == BODY
    assert counter[0] >= len(BODY)


def test_with_the_same_checkpoint_on_local_disk_no_byte_is_read_from_efs(
        s3env: S3Env, efs_reads, monkeypatch, tmp_path: Path) -> None:
    efs, counter = efs_reads
    local = tmp_path / "nvme" / "job-1"
    save(local, "step-000010", 10)
    save(efs, "step-000010", 10)
    mirror_as_the_engine_runs_it(s3env, monkeypatch, efs, local)
    assert counter[0] == 0
    assert uploaded(s3env, "step-000010.pt") == BODY
    assert uploaded(s3env, "step-000010.manifest.json").decode() == \
        (efs / "step-000010.manifest.json").read_text()
    assert mirror.read_status(efs)["manifest"] == URL + "step-000010.manifest.json"


@pytest.mark.parametrize("twin", ["another manifest", "short", "no manifest", "missing"])
def test_a_local_copy_that_is_not_the_same_checkpoint_is_not_used(
        s3env: S3Env, efs_reads, monkeypatch, tmp_path: Path, twin: str) -> None:
    """Only a complete twin under the EFS manifest stands in for EFS: a stale copy (another
    attempt's checkpoint of the same name), a short file, one without its manifest or none
    at all, and the bytes S3 gets are EFS's."""
    efs, counter = efs_reads
    local = tmp_path / "nvme" / "job-1"
    save(efs, "step-000010", 10)
    if twin == "another manifest":
        save(local, "step-000010", 10, b"stale" * 10, written_at=5.0)
    elif twin == "short":
        save(local, "step-000010", 10)
        (local / "step-000010.pt").write_bytes(BODY[:-1])
    elif twin == "no manifest":
        save(local, "step-000010", 10)
        (local / "step-000010.manifest.json").unlink()
    mirror_as_the_engine_runs_it(s3env, monkeypatch, efs, local)
    assert uploaded(s3env, "step-000010.pt") == BODY
    assert counter[0] >= len(BODY)


def test_the_example_jobs_local_copy_spares_every_efs_read(
        s3env: S3Env, efs_reads, monkeypatch, tmp_path: Path) -> None:
    """The example job with ``DL_CHECKPOINT_LOCAL_DIR``: the real ``save_checkpoint`` writes
    the node-local copy first and EFS's from it; the mirror then uploads two checkpoints
    (the second after the first was pruned by ``keep``) reading nothing back from EFS."""
    import torch

    from bootstrap_scripts.examples import checkpoints as example

    efs, counter = efs_reads
    local = tmp_path / "nvme" / "job-1"
    state = {"epoch": 1, "step": 5, "global_step": 5, "model": torch.arange(50000.0)}
    example.save_checkpoint(efs, state, "step-000005.pt", keep=1, local=local)
    first = (local / "step-000005.pt").read_bytes()
    mirror_as_the_engine_runs_it(s3env, monkeypatch, efs, local)
    example.save_checkpoint(efs, {**state, "step": 10, "global_step": 10},
                            "step-000010.pt", keep=1, local=local)
    mirror_as_the_engine_runs_it(s3env, monkeypatch, efs, local)
    assert counter[0] == 0
    assert uploaded(s3env, "step-000005.pt") == first
    assert uploaded(s3env, "step-000010.pt") == (local / "step-000010.pt").read_bytes()
    assert (efs / "step-000010.pt").read_bytes() == (local / "step-000010.pt").read_bytes()
    assert sorted(p.name for p in local.iterdir()) == sorted(
        p.name for p in efs.iterdir() if p.name not in ("latest.json", mirror.STATUS_FILE))
