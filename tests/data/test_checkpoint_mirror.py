"""The checkpoint mirror and restore against moto's S3 server (over HTTP), real files."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from bootstrap_scripts.data import checkpoint_mirror as mirror
from bootstrap_scripts.data import checkpoint_plan as cp
from bootstrap_scripts.jobs.engine.summary import ERROR_LINE_RE
from tests.data.conftest import S3Env

URL = "s3://training-data/checkpoints/c1/alice/job-1/"
PREFIX = "checkpoints/c1/alice/job-1/"


def save(directory: Path, name: str, step: int, body: bytes = b"weights",
         manifest: bool = True) -> None:
    """What a training job does: the data file, then its manifest last."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.pt").write_bytes(body)
    if manifest:
        m = cp.new_manifest(name, step, float(step), [(f"{name}.pt", len(body))])
        (directory / m.manifest_file).write_text(m.render())


def client(env: S3Env):
    return mirror.s3_client("us-east-1")


def keys(env: S3Env) -> list[str]:
    out = env.s3.list_objects_v2(Bucket=env.bucket, Prefix=PREFIX)  # type: ignore[attr-defined]
    return sorted(o["Key"][len(PREFIX):] for o in out.get("Contents", []))


def test_the_mirror_uploads_complete_checkpoints_only_manifest_last(
        s3env: S3Env, tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    save(ck, "step-000010", 10)
    save(ck, "step-000020", 20, manifest=False)  # still being written
    calls: list[str] = []
    s3 = client(s3env)
    original = s3.put_object
    s3.put_object = lambda **kw: (calls.append(kw["Key"]), original(**kw))[1]
    done = mirror.mirror_once(s3, ck, URL)
    assert [m.name for m in done] == ["step-000010"]
    assert keys(s3env) == ["step-000010.manifest.json", "step-000010.pt"]
    # the transfer manager puts a small file with put_object too: the order is seen
    assert calls == [PREFIX + "step-000010.pt", PREFIX + "step-000010.manifest.json"]
    assert mirror.read_status(ck)["manifest"] == URL + "step-000010.manifest.json"
    assert mirror.mirror_once(s3, ck, URL) == []  # nothing new: nothing uploaded
    save(ck, "step-000020", 20)
    assert [m.name for m in mirror.mirror_once(s3, ck, URL)] == ["step-000020"]


def test_restore_fetches_the_newer_s3_checkpoint_when_efs_lost_its_copy(
        s3env: S3Env, tmp_path: Path, capsys) -> None:
    ck = tmp_path / "ck"
    save(ck, "step-000010", 10, b"ten")
    save(ck, "step-000020", 20, b"twenty")
    s3 = client(s3env)
    mirror.mirror_once(s3, ck, URL)
    for f in ck.glob("step-000020*"):
        f.unlink()  # the EFS copy of the newest is gone
    (ck / "step-000030.pt").write_bytes(b"half")  # a checkpoint without its manifest
    choice = mirror.restore(s3, ck, [URL])
    assert (choice.manifest.name, choice.where) == ("step-000020", cp.S3)
    assert (ck / "step-000020.pt").read_bytes() == b"twenty"
    assert (ck / "step-000020.manifest.json").exists()
    out = capsys.readouterr().out
    assert "ignored" in out and "step-000030.pt" in out and "no manifest" in out
    assert not list(ck.glob(".*dl-part"))
    again = mirror.restore(s3, ck, [URL])  # now EFS has it: nothing fetched
    assert (again.manifest.name, again.where) == ("step-000020", cp.EFS)


def test_a_denied_restore_names_the_place_and_access_denied(s3env: S3Env,
                                                           tmp_path: Path) -> None:
    """The attempt does not start, and the reason names what the job role may not read
    (botocore's own text names only the operation)."""
    ck = tmp_path / "ck"
    save(ck, "step-000010", 10)
    s3 = client(s3env)
    mirror.mirror_once(s3, ck, URL)
    for f in ck.glob("step-000010*"):
        f.unlink()

    def refused(*_a, **_kw):
        raise ClientError({"Error": {"Code": "AccessDenied", "Message": "Access Denied"}},
                          "GetObject")

    s3.download_file = refused
    with pytest.raises(mirror.CheckpointError) as exc:
        mirror.restore(s3, ck, [URL])
    assert str(exc.value).startswith(URL) and "AccessDenied" in str(exc.value)
    s3.list_objects_v2 = lambda **_kw: (_ for _ in ()).throw(ClientError(
        {"Error": {"Code": "403", "Message": "Forbidden"}}, "ListObjectsV2"))
    with pytest.raises(mirror.CheckpointError, match=f"^{URL}: AccessDenied: Forbidden"):
        mirror.restore(s3, ck, [URL])


def test_a_failed_restore_ends_with_the_error_line_the_jobs_summary_quotes(
        s3env: S3Env, tmp_path: Path, monkeypatch, capsys) -> None:
    """The restore tool as the restore job runs it, on a bucket that does not exist: it
    exits 1, and its last line is an error line (``summary.ERROR_LINE_RE``) naming the
    place and S3's code, so the job's FAILED line carries the cause, not just the exit
    code."""
    monkeypatch.setenv("DL_ROOT", str(s3env.root))
    missing = "s3://no-such-checkpoints/checkpoints/c1/alice/job-1/"
    code = mirror.main(["restore", "--dir", str(tmp_path / "ck"), "--url", missing])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert code == 1
    assert ERROR_LINE_RE.match(last), last
    assert missing in last and "NoSuchBucket" in last, last


def test_restore_ignores_an_s3_checkpoint_whose_manifest_is_missing(
        s3env: S3Env, tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    save(ck, "step-000010", 10)
    s3env.put(PREFIX + "step-000090.pt", b"no manifest")  # an upload cut short
    choice = mirror.restore(client(s3env), ck, [URL])
    assert (choice.manifest.name, choice.where) == ("step-000010", cp.EFS)
    assert not (ck / "step-000090.pt").exists()


def test_watch_makes_a_last_pass_when_stopped(s3env: S3Env, tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    stop = threading.Event()
    t = threading.Thread(target=mirror.watch, args=(client(s3env), ck, URL, 30.0, stop))
    t.start()
    save(ck, "step-000010", 10)  # written while the mirror waits for its next pass
    stop.set()
    t.join(timeout=20)
    assert not t.is_alive()
    assert "step-000010.manifest.json" in keys(s3env)


def test_restore_syncs_every_file_and_its_directory_before_the_manifest_appears(
        s3env: S3Env, tmp_path: Path, monkeypatch) -> None:
    """A restored checkpoint's manifest tells every later restart "complete", so its files
    reach the disk first: each file synced before its rename, the directories synced
    before the manifest's rename (the syncs are real; they are only watched)."""
    import os

    from bootstrap_scripts.data import durable

    src, ck = tmp_path / "src", tmp_path / "ck"
    src.mkdir()
    (src / "shards").mkdir()
    (src / "step-000040.pt").write_bytes(b"model")
    (src / "shards/optim-0.pt").write_bytes(b"optimizer")
    m = cp.new_manifest("step-000040", 40, 40.0, [("step-000040.pt", 5),
                                                  ("shards/optim-0.pt", 9)])
    (src / m.manifest_file).write_text(m.render())
    s3 = client(s3env)
    mirror.mirror_once(s3, src, URL)
    events: list[tuple[str, str]] = []
    real = {"sync_file": durable.sync_file, "sync_dir": durable.sync_dir,
            "replace": os.replace}
    for name in ("sync_file", "sync_dir"):
        monkeypatch.setattr(durable, name, lambda p, _n=name: (
            real[_n](p), events.append((_n, Path(p).relative_to(ck).as_posix())))[0])
    monkeypatch.setattr(os, "replace", lambda a, b, **kw: (
        real["replace"](a, b, **kw), events.append(("rename", Path(b).relative_to(ck)
                                                    .as_posix())))[0])
    assert mirror.restore(s3, ck, [URL]).where == cp.S3
    renames = [p for kind, p in events if kind == "rename"]
    assert renames[-1] == m.manifest_file and len(renames) == 3
    before_manifest = events[:events.index(("rename", m.manifest_file))]
    for rel in ("step-000040.pt", "shards/optim-0.pt"):
        part = f"{Path(rel).parent / ('.' + Path(rel).name)}{mirror.PART_SUFFIX}"
        part = part.removeprefix("./")
        assert events.index(("sync_file", part)) < events.index(("rename", rel)), rel
    assert {("sync_dir", "."), ("sync_dir", "shards")} <= set(before_manifest)
    assert events[-1] == ("sync_dir", ".")  # and the manifest's own name
