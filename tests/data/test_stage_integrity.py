"""What the stager's records vouch for, against moto's S3 server over HTTP: a journal line or
manifest is written only after the data it names was synced to the disk, and every object
botocore could not check against S3's checksum is counted, recorded and named in one
warning (bootstrap_scripts/data/durable.py, checksums.py)."""

from __future__ import annotations

import base64
import json
import os
import zlib
from pathlib import Path

import boto3
import pytest
from botocore.compat import HAS_CRT

from bootstrap_scripts.data import checksums, durable, fetch, stage
from bootstrap_scripts.data.plan import StageError
from bootstrap_scripts.jobs.engine import staging
from bootstrap_scripts.protocol.membership import build_membership
from bootstrap_scripts.protocol.paths import ClusterPaths
from bootstrap_scripts.protocol.run_request import RunRequest
from tests.data.conftest import S3Env, crc64nvme, put_raw, run_stage


def on_disk(directory: Path) -> dict[str, int]:
    """rel path -> size of the staged files under their final names."""
    return {p.relative_to(directory).as_posix(): p.stat().st_size
            for p in directory.rglob("*") if p.is_file() and ".dl-stage" not in p.parts
            and stage.PART_SUFFIX not in p.name}


def test_no_journal_line_or_manifest_before_its_data_was_synced(s3env, tmp_path, monkeypatch
                                                                ) -> None:
    """Every journal line is written after a sync of the file system that followed its
    object's rename, and the manifest after one that covered every file: the order a power
    loss cannot break (the syncs are real; they are only watched)."""
    bodies = {f"ds/{i:03d}.bin": os.urandom(4096 + 37 * i) for i in range(150)}
    for key, body in bodies.items():
        s3env.put(key, body)
    out = tmp_path / "out"
    events: list[tuple[str, object]] = []
    real_sync, real_write, real_replace = durable.sync_filesystem, os.write, os.replace

    def sync_filesystem(path):
        files = on_disk(out)  # what is under its final name now is what this sync covers
        real_sync(path)
        events.append(("sync", files))

    def write(fd, data):
        if os.readlink(f"/proc/self/fd/{fd}").endswith(f"{stage.STATE_DIR}/{stage.JOURNAL}"):
            events.append(("journal", [json.loads(line)["key"]
                                       for line in bytes(data).decode().splitlines()]))
        return real_write(fd, data)

    def replace(src, dst, **kw):
        real_replace(src, dst, **kw)
        if str(dst).endswith(f"{stage.STATE_DIR}/{stage.MANIFEST}"):
            events.append(("manifest", None))

    monkeypatch.setattr(durable, "sync_filesystem", sync_filesystem)
    monkeypatch.setattr(os, "write", write)
    monkeypatch.setattr(os, "replace", replace)
    run_stage(s3env, f"s3://training-data/ds:{out}")

    synced: dict[str, int] = {}
    journalled: list[str] = []
    for kind, what in events:
        if kind == "sync":
            synced.update(what)  # type: ignore[arg-type]
        elif kind == "journal":
            for key in what:  # type: ignore[union-attr]
                rel = key.removeprefix("ds/")
                assert synced.get(rel) == len(bodies[key]), f"{key} journalled before a sync"
                journalled.append(key)
        else:
            assert synced == {k.removeprefix("ds/"): len(b) for k, b in bodies.items()}, \
                "the manifest was written before every file was synced"
    assert [k for k, _ in events].count("manifest") == 1
    assert sorted(journalled) == sorted(bodies)
    assert [k for k, _ in events].count("sync") >= 2, "150 objects: more than one commit"


def test_objects_botocore_cannot_check_are_counted_and_named_once(s3env, tmp_path, capsys
                                                                  ) -> None:
    """CRC32 objects are checked; CRC64NVME ones only with awscrt (botocore computes it
    only then); one with no checksum never. The count goes into the result (and so into
    staging.json), and one warning line says why and what to do."""
    bodies = {f"mix/crc32-{i}.bin": os.urandom(3000 + i) for i in range(3)}
    for key, body in bodies.items():
        s3env.put(key, body)  # boto3 sends CRC32, its default
    for i in range(2):
        body = os.urandom(5000 + i)
        bodies[f"mix/nvme-{i}.bin"] = body
        put_raw(s3env, f"mix/nvme-{i}.bin", body, ("CRC64NVME", crc64nvme(body)))
    bodies["mix/old.bin"] = b"from before S3 kept checksums"
    put_raw(s3env, "mix/old.bin", bodies["mix/old.bin"], None)
    result = run_stage(s3env, f"s3://training-data/mix:{tmp_path / 'out'}")
    assert {p: (tmp_path / "out" / p.removeprefix("mix/")).read_bytes() == b
            for p, b in bodies.items()} == dict.fromkeys(bodies, True)
    printed = [line for line in capsys.readouterr().out.splitlines() if "checksum" in line]
    if HAS_CRT:  # botocore checks CRC64NVME itself then
        assert result["unverified"] == 1
        assert printed == ["dl-stage: warning: 1 of 6 object(s) staged without a checksum "
                           "check: 1 " + checksums.EXPLAINED[checksums.NO_CHECKSUM]]
    else:
        assert result["unverified"] == 3
        assert printed == ["dl-stage: warning: 3 of 6 object(s) staged without a checksum "
                           "check: 2 with CRC64NVME; 1 "
                           + checksums.EXPLAINED[checksums.NO_CHECKSUM] + "; "
                           + checksums.CRT_ADVICE]
        assert "pip install 'botocore[crt]'" in printed[0]
    again = run_stage(s3env, f"s3://training-data/mix:{tmp_path / 'out'}")
    assert (again["copied"], again["unverified"]) == (0, 0)  # nothing fetched, nothing said


def test_a_body_that_does_not_match_its_checksum_fails_the_object(s3env, tmp_path) -> None:
    """The check is real: an object whose stored CRC32 is not its bytes' (moto keeps the
    value a client sent without checking it; S3 would refuse the upload) fails the staging,
    naming the object, and nothing is recorded complete."""
    s3env.put("bad/ok.bin", b"fine")
    body = os.urandom(4000)
    wrong = base64.b64encode(((zlib.crc32(body) + 1) & 0xFFFFFFFF).to_bytes(4, "big")).decode()
    put_raw(s3env, "bad/flipped.bin", body, ("CRC32", wrong))
    out = tmp_path / "out"
    with pytest.raises(StageError, match=r"s3://training-data/bad/flipped\.bin: "
                                         r"FlexibleChecksumError: .*did not match"):
        run_stage(s3env, f"s3://training-data/bad:{out}")
    assert not (out / "flipped.bin").exists()
    assert not (out / ".dl-stage/manifest.json").exists()
    journal = out / ".dl-stage/journal"
    assert "flipped" not in (journal.read_text() if journal.exists() else "")


def test_why_a_response_was_not_checked(s3env) -> None:
    """``checksum_gap`` on moto's real responses: a whole CRC32 object is checked, a range
    of it is not (S3 sends no checksum for a range), and a CRC64NVME one is not without
    awscrt."""
    client = boto3.client("s3", endpoint_url=s3env.endpoint, region_name="us-east-1")
    s3env.put("g/crc32.bin", b"x" * 100)
    put_raw(s3env, "g/nvme.bin", b"y" * 100, ("CRC64NVME", crc64nvme(b"y" * 100)))
    whole = client.get_object(Bucket=s3env.bucket, Key="g/crc32.bin")
    ranged = client.get_object(Bucket=s3env.bucket, Key="g/crc32.bin", Range="bytes=0-9")
    nvme = client.get_object(Bucket=s3env.bucket, Key="g/nvme.bin")
    assert checksums.checksum_gap(whole, ranged=False) == ""
    assert checksums.checksum_gap(ranged, ranged=True) == checksums.RANGED
    assert checksums.checksum_gap(nvme, ranged=False) == ("" if HAS_CRT else "CRC64NVME")
    for response in (whole, ranged, nvme):
        response["Body"].read()


def test_the_count_reaches_the_jobs_staging_record_and_its_first_lines(tmp_path, capsys
                                                                      ) -> None:
    paths = ClusterPaths(tmp_path).job("j.stage")
    paths.nodes.mkdir(parents=True)
    line = {"directory": "/d", "objects": 4, "copied": 4, "bytes": 5, "copied_bytes": 5,
            "seconds": 0.1, "gbps": 0.1}
    paths.log(0).write_text(f"DL_STAGE_RESULT {json.dumps({**line, 'unverified': 3})}\n")
    paths.log(1).write_text(f"DL_STAGE_RESULT {json.dumps(line)}\n")  # an older stager's
    nodes = [{"instance_id": f"i-{k}", "address": f"127.20.0.{k + 1}", "gpus": 0}
             for k in range(2)]
    m = build_membership(cluster_id="c", generation=1, efs_mount="/efs", master=nodes[0],
                         workers=nodes[1:], reason="test")
    request = RunRequest(job_id="j", command=("t",), data="s3://b-1/ds")
    report = staging.report(request, m, paths, 1.0)
    assert [n.unverified for n in report.nodes] == [3, 0]
    assert type(report).from_json(report.to_json()) == report
    staging.announce(report)
    assert ("3 object(s) staged without a checksum check (why, and what to do: the staging "
            "job j.stage's node logs)") in capsys.readouterr().err


def journalled(out: Path) -> list[str]:
    journal = out / ".dl-stage/journal"
    return [json.loads(line)["key"] for line in journal.read_text().splitlines()] \
        if journal.exists() else []


def put_multipart(env: S3Env, key: str, parts: list[bytes]) -> bytes:
    """A multipart upload with CRC32 checksums: S3 keeps a composite checksum (the CRC32 of
    the parts' CRC32s, ``...-N``), which says nothing botocore can check the whole body
    against. Its bytes."""
    s3 = env.s3
    upload = s3.create_multipart_upload(Bucket=env.bucket, Key=key, ChecksumAlgorithm="CRC32")
    done = []
    for number, body in enumerate(parts, 1):
        sent = s3.upload_part(Bucket=env.bucket, Key=key, UploadId=upload["UploadId"],
                              PartNumber=number, Body=body, ChecksumAlgorithm="CRC32")
        done.append({"PartNumber": number, "ETag": sent["ETag"],
                     "ChecksumCRC32": sent["ChecksumCRC32"]})
    s3.complete_multipart_upload(Bucket=env.bucket, Key=key, UploadId=upload["UploadId"],
                                 MultipartUpload={"Parts": done})
    return b"".join(parts)


@pytest.mark.parametrize("kind", ["CRC64NVME", "none", "composite"])
def test_required_refuses_the_first_object_it_cannot_check(s3env, tmp_path, kind) -> None:
    """``--data-checksums required``: the staging fails on the object botocore did not check,
    naming it, why and what to do; the objects checked before it stay complete (file and
    journal line), it has neither, and a run that accepts it resumes from there."""
    if kind == "CRC64NVME" and HAS_CRT:
        pytest.skip("with awscrt botocore checks CRC64NVME: nothing to refuse")
    bodies = {f"req/a-{i}.bin": os.urandom(3000 + i) for i in range(4)}
    for key, body in bodies.items():
        s3env.put(key, body)  # CRC32, checked
    if kind == "composite":  # parts of 5 MiB at least: S3's (and moto's) minimum
        bad = put_multipart(s3env, "req/z-bad.bin", [os.urandom(5 * 2**20), b"tail"])
    else:
        bad = os.urandom(5000)
        put_raw(s3env, "req/z-bad.bin", bad,
                ("CRC64NVME", crc64nvme(bad)) if kind == "CRC64NVME" else None)
    out = tmp_path / "out"
    why = {"CRC64NVME": r"its checksum in S3 is CRC64NVME\. To stage it: .*"
                        r"pip install 'botocore\[crt\]'",
           "none": r"it is an object with no checksum in S3 .*To stage it: copy it in "
                   r"place with a checksum algorithm",
           "composite": r"it is an object with a multipart upload's checksum of its parts' "
                        r"checksums .*To stage it: upload it again in one part"}[kind]
    # one transfer at once: the four checked objects (keys first) are fetched before it
    with pytest.raises(StageError, match=r"^s3://training-data/req/z-bad\.bin: refused by "
                                         r"--data-checksums required, its bytes could not "
                                         rf"be checked against S3's checksum: {why}.*; or "
                                         r"accept it unchecked with --data-checksums warn$"):
        run_stage(s3env, f"s3://training-data/req:{out}", concurrency=1,
                  checksums=checksums.REQUIRED)
    assert sorted(journalled(out)) == sorted(bodies)
    assert on_disk(out) == {k.removeprefix("req/"): len(b) for k, b in bodies.items()}
    assert not [p for p in out.rglob("*") if stage.PART_SUFFIX in p.name]
    assert not (out / ".dl-stage/manifest.json").exists()
    again = run_stage(s3env, f"s3://training-data/req:{out}")  # warn: it is staged
    assert (again["copied"], again["unverified"]) == (1, 1)
    assert (out / "z-bad.bin").read_bytes() == bad


def test_required_stops_at_the_refused_object(s3env, tmp_path) -> None:
    """The refusal ends the staging: the objects not started yet are not fetched (no file,
    no journal line), and the error names the refused object alone."""
    put_raw(s3env, "stop/a-bad.bin", b"no checksum", None)
    for i in range(5):
        s3env.put(f"stop/b-{i}.bin", os.urandom(2000))
    out = tmp_path / "out"
    with pytest.raises(StageError, match=r"^s3://training-data/stop/a-bad\.bin: refused .*"
                                         r"--data-checksums warn$"):
        run_stage(s3env, f"s3://training-data/stop:{out}", concurrency=1,
                  checksums=checksums.REQUIRED)
    assert (journalled(out), on_disk(out)) == ([], {})
    assert not [p for p in out.rglob("*") if stage.PART_SUFFIX in p.name]


def test_required_passes_objects_botocore_checks(s3env, tmp_path) -> None:
    bodies = {f"ok/{i}.bin": os.urandom(4000 + i) for i in range(6)}
    for key, body in bodies.items():
        s3env.put(key, body)
    out = tmp_path / "out"
    result = run_stage(s3env, f"s3://training-data/ok:{out}", checksums=checksums.REQUIRED)
    assert (result["copied"], result["unverified"]) == (6, 0)
    assert {k: (out / k.removeprefix("ok/")).read_bytes() == b for k, b in bodies.items()} \
        == dict.fromkeys(bodies, True)
    manifest = json.loads((out / ".dl-stage/manifest.json").read_text())  # complete
    assert sorted(manifest["objects"]) == sorted(bodies)


def getobject_ranges(client) -> list[str | None]:
    """The ``Range`` of every GetObject ``client`` makes from now on (None: whole object)."""
    seen: list[str | None] = []
    client.meta.events.register("provide-client-params.s3.GetObject",
                                lambda params, **_: seen.append(params.get("Range")))
    return seen


def test_required_fetches_a_large_object_whole_so_its_checksum_is_checked(
        s3env, tmp_path, monkeypatch) -> None:
    """Over the part size (lowered here to 64 KiB) ``warn`` fetches ranges, which carry no
    checksum, and counts the object unverified; ``required`` fetches it in one GetObject,
    which botocore checks: a good object is staged checked, one whose stored CRC32 is not
    its bytes' fails."""
    monkeypatch.setattr(fetch, "DEFAULT_PART_SIZE", 64 * 1024)
    body = os.urandom(300 * 1024)
    s3env.put("big/x.bin", body)
    client = stage.s3_client("us-east-1", 8)
    ranges = getobject_ranges(client)
    warned = run_stage(s3env, f"s3://training-data/big:{tmp_path / 'warn'}", client=client)
    assert warned["unverified"] == 1 and len(ranges) == 5 and None not in ranges
    ranges.clear()
    out = tmp_path / "required"
    result = run_stage(s3env, f"s3://training-data/big:{out}", client=client,
                       checksums=checksums.REQUIRED)
    assert (ranges, result["unverified"]) == ([None], 0)
    assert (out / "x.bin").read_bytes() == body

    wrong = base64.b64encode(((zlib.crc32(body) + 1) & 0xFFFFFFFF).to_bytes(4, "big")).decode()
    put_raw(s3env, "flipped/x.bin", body, ("CRC32", wrong))  # moto: no unsigned overwrite
    out = tmp_path / "flipped"
    with pytest.raises(StageError, match=r"s3://training-data/flipped/x\.bin: "
                                         r"FlexibleChecksumError: .*did not match"):
        run_stage(s3env, f"s3://training-data/flipped:{out}", client=client,
                  checksums=checksums.REQUIRED)
    assert not (out / "x.bin").exists() and journalled(out) == []
