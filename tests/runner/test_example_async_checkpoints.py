"""The example's checkpoints written in the background (examples/checkpoint_writer.py): the
loop waits only for a copy, the job exits only once its last save is whole, a writer error
fails the job, a checkpoint is complete (manifest) only after its data file is whole, and a
resume takes the newest complete one.

``torch.save`` is replaced by a wrapper that writes the real bytes but can pause half-way
(an :class:`threading.Event`), be slow, or fail: a slow disk made deterministic. The
example's ``main`` runs in this process (no torchrun: one rank, rank 0)."""

from __future__ import annotations

import errno
import io
import os
import re
import signal
import threading
import time

import pytest
import torch

from bootstrap_scripts.examples import checkpoints, train_digits
from bootstrap_scripts.examples.checkpoint_writer import CheckpointWriteError, CheckpointWriter

REAL_SAVE = torch.save


class Disk:
    """``torch.save`` as a disk the test controls: ``pause="start"`` holds each write before
    it reads the state, ``pause="half"`` after half its bytes, until ``resume`` is set
    (``held`` says it is held); ``delay`` sleeps before writing; ``fail`` raises ENOSPC after
    half the bytes; ``on_first`` runs once, in the writer, before the first write."""

    def __init__(self, *, pause: str = "", delay: float = 0.0, fail: bool = False,
                 on_first=None) -> None:
        self.pause, self.delay, self.fail, self.on_first = pause, delay, fail, on_first
        self.held, self.resume = threading.Event(), threading.Event()
        self.writes: list[str] = []

    def __call__(self, obj, f) -> None:
        if self.on_first is not None:
            self.on_first, first = None, self.on_first
            first()
        time.sleep(self.delay)
        if self.pause == "start":
            self.hold()
        buf = io.BytesIO()
        REAL_SAVE(obj, buf)
        data = buf.getvalue()
        with open(f, "wb") as fh:
            fh.write(data[:len(data) // 2])
            fh.flush()
            if self.fail:
                raise OSError(errno.ENOSPC, "No space left on device")
            if self.pause == "half":
                self.hold()
            fh.write(data[len(data) // 2:])
        self.writes.append(str(f))

    def hold(self) -> None:
        self.held.set()
        assert self.resume.wait(10), "the test never resumed the write"


@pytest.fixture()
def example_env(monkeypatch):
    """The example in-process as a plain one-rank run; what its ``main`` changes in this
    process (SIGTERM handler, torch's thread count) put back afterwards."""
    for name in ("WORLD_SIZE", "TORCHELASTIC_RUN_ID", "DL_JOB_ID", "DL_RESUME",
                 "DL_CHECKPOINT_DIR", "DL_TENSORBOARD_DIR", "DL_PROGRESS_DIR", "DL_DATA_DIR"):
        monkeypatch.delenv(name, raising=False)
    handler, threads = signal.getsignal(signal.SIGTERM), torch.get_num_threads()
    yield
    signal.signal(signal.SIGTERM, handler)
    torch.set_num_threads(threads)


def state(value: float) -> dict:
    return {"model": {"w": torch.full((256,), value)}, "epoch": 1, "step": int(value),
            "global_step": int(value)}


def test_a_save_costs_the_loop_a_copy_and_the_copy_is_what_is_written(tmp_path, monkeypatch):
    live = state(1.0)
    with CheckpointWriter(tmp_path, keep=3) as saver:
        for n in (1, 2):  # the second save copies into the first one's memory
            disk = Disk(pause="start")
            monkeypatch.setattr(torch, "save", disk)
            saver.save(live, f"step-{n:06d}.pt")  # returns while the write is held
            assert disk.held.wait(5)
            live["model"]["w"].add_(40.0)  # the next optimizer step changes the live tensors
            disk.resume.set()
            saver.wait()
    for n, value in ((1, 1.0), (2, 41.0)):
        saved = checkpoints.load_checkpoint(tmp_path / f"step-{n:06d}.pt", "cpu")
        assert torch.equal(saved["model"]["w"], torch.full((256,), value)), n


def test_a_checkpoint_is_complete_only_once_its_data_file_is_whole(tmp_path, monkeypatch):
    with CheckpointWriter(tmp_path, keep=3) as saver:
        saver.save(state(1.0), "step-000001.pt")
        saver.wait()
        disk = Disk(pause="half")
        monkeypatch.setattr(torch, "save", disk)
        saver.save(state(2.0), "step-000002.pt")
        assert disk.held.wait(5)
        # half of step 2's data is on disk: it has no manifest, and a resume now takes step 1
        assert not (tmp_path / "step-000002.manifest.json").exists()
        assert not (tmp_path / "step-000002.pt").exists()  # still under its temporary name
        assert checkpoints.latest_info(tmp_path)["file"] == "step-000001.pt"
        disk.resume.set()
    manifest = checkpoints.newest_manifest(tmp_path)
    assert manifest["file"] == "step-000002.pt"
    assert checkpoints.latest_info(tmp_path)["path"] == tmp_path / "step-000002.pt"


def test_a_writer_error_fails_the_next_save(tmp_path, monkeypatch):
    monkeypatch.setattr(torch, "save", Disk(fail=True))
    saver = CheckpointWriter(tmp_path, keep=3)
    saver.save(state(1.0), "step-000001.pt")  # accepted: the failure is the writer's
    with pytest.raises(CheckpointWriteError, match=r"step-000001\.pt .*No space left"):
        saver.save(state(2.0), "step-000002.pt")
    saver.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no manifest, no temp file


def test_a_writer_error_fails_the_close(tmp_path, monkeypatch):
    monkeypatch.setattr(torch, "save", Disk(fail=True))
    saver = CheckpointWriter(tmp_path, keep=3)
    saver.save(state(1.0), "epoch-0001.pt")
    with pytest.raises(CheckpointWriteError, match=r"epoch-0001\.pt"):
        saver.close()


def test_a_writer_error_is_reported_even_when_the_job_already_fails(tmp_path, monkeypatch,
                                                                       capsys):
    monkeypatch.setattr(torch, "save", Disk(fail=True))
    with pytest.raises(RuntimeError, match="peer lost"), \
            CheckpointWriter(tmp_path, keep=3) as saver:
        saver.save(state(1.0), "step-000001.pt")
        raise RuntimeError("peer lost")
    assert "step-000001.pt" in capsys.readouterr().err


def test_the_example_exits_only_after_its_last_save_is_whole(tmp_path, monkeypatch,
                                                            example_env, capsys):
    disk = Disk(delay=0.4)  # slower than the rest of the run after the epoch's save
    monkeypatch.setattr(torch, "save", disk)
    ckdir = tmp_path / "ck"
    rc = train_digits.main(["--epochs", "1", "--checkpoint-every", "0", "--hidden", "16",
                            "--checkpoint-dir", str(ckdir)])
    assert rc == 0
    assert len(disk.writes) == 1
    assert checkpoints.newest_manifest(ckdir)["file"] == "epoch-0001.pt"
    assert re.search(r"^checkpoints mode=async saves=1 .*write_ms_per_save=\d",
                     capsys.readouterr().out, re.M)


def test_a_sigterm_drains_the_save_in_flight(tmp_path, monkeypatch, example_env, capsys):
    """SIGTERM arrives while a step checkpoint is being written: the example saves where it
    stopped (after waiting for that one) and exits only once both are whole."""
    disk = Disk(delay=0.3, on_first=lambda: os.kill(os.getpid(), signal.SIGTERM))
    monkeypatch.setattr(torch, "save", disk)
    ckdir = tmp_path / "ck"
    rc = train_digits.main(["--epochs", "2", "--checkpoint-every", "4", "--hidden", "16",
                            "--checkpoint-dir", str(ckdir)])
    out = capsys.readouterr().out
    assert rc == 128 + signal.SIGTERM, out
    stopped = int(re.search(r"stopped by signal 15 at step (\d+)", out).group(1))
    assert stopped >= 4
    info = checkpoints.latest_info(ckdir)
    assert info["file"] == f"step-{stopped:06d}.pt" and info["step"] == stopped
    # every save is whole (the signal may be seen a few steps after the write began): each
    # step checkpoint has its manifest, no write is left under its temporary name
    names = sorted(p.name for p in ckdir.iterdir())
    assert [n for n in names if n.startswith(".")] == [], names
    assert [n.replace(".pt", ".manifest.json") for n in names if n.endswith(".pt")] == \
        [n for n in names if n.endswith(".manifest.json")]
    assert re.search(r"^checkpoints mode=async saves=\d+ ", out, re.M), out


def test_a_failed_background_save_fails_the_example(tmp_path, monkeypatch, example_env):
    monkeypatch.setattr(torch, "save", Disk(fail=True))
    with pytest.raises(CheckpointWriteError, match=r"step-000005\.pt .*No space left"):
        train_digits.main(["--epochs", "1", "--checkpoint-every", "5", "--hidden", "16",
                           "--checkpoint-dir", str(tmp_path / "ck")])


def test_a_resume_takes_the_newest_complete_checkpoint(tmp_path, example_env, capsys):
    ckdir = tmp_path / "ck"
    args = ["--checkpoint-every", "10", "--hidden", "16", "--checkpoint-dir", str(ckdir)]
    assert train_digits.main(["--epochs", "1", *args]) == 0
    # a crash half-way through a later save: its data file, no manifest; latest.json updated
    # by something else to point at it. The manifest decides.
    (ckdir / "step-000030.pt").write_bytes(b"half a checkpoint")
    (ckdir / "latest.json").write_text('{"epoch": 2, "step": 7, "file": "step-000030.pt"}')
    capsys.readouterr()
    assert train_digits.main(["--epochs", "2", "--resume", *args]) == 0
    assert f"resumed from {ckdir / 'epoch-0001.pt'} (epoch 1, step 23/23" in \
        capsys.readouterr().out


def test_sync_mode_writes_in_the_loop(tmp_path, monkeypatch, example_env, capsys):
    """``--sync-checkpoints`` (the comparison ``make bench`` prints) writes before save()
    returns: the loop's blocked time includes the write."""
    disk = Disk(delay=0.1)
    monkeypatch.setattr(torch, "save", disk)
    assert train_digits.main(["--epochs", "1", "--checkpoint-every", "0", "--hidden", "16",
                              "--sync-checkpoints", "--checkpoint-dir",
                              str(tmp_path / "ck")]) == 0
    line = re.search(r"^checkpoints mode=sync saves=1 blocked_ms_per_save=([\d.]+) ",
                     capsys.readouterr().out, re.M)
    assert line and float(line.group(1)) >= 100

