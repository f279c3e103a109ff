"""What the stager's records vouch for, against moto's S3 server over HTTP: a journal line or
manifest is written only after the data it names was synced to the disk, and every object
botocore could not check against S3's checksum is counted, recorded and named in one
warning (bootstrap_scripts/data/durable.py, checksums.py)."""

from __future__ import annotations

import base64
import json
import os
import urllib.request
import zlib
from pathlib import Path

import boto3
import pytest
from botocore.compat import HAS_CRT

from bootstrap_scripts.data import checksums, durable, stage
from bootstrap_scripts.data.plan import StageError
from bootstrap_scripts.jobs.engine import staging
from bootstrap_scripts.protocol.jobs import RunRequest
from bootstrap_scripts.protocol.membership import build_membership
from bootstrap_scripts.protocol.paths import ClusterPaths
from tests.data.conftest import S3Env, run_stage


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


def crc64nvme(data: bytes) -> str:
    """S3's CRC64NVME of ``data``, base64 as S3 sends it (reflected, polynomial
    0x9A6C9329AC4BC9B5, initial and final XOR all ones): the standard library has none."""
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x9A6C9329AC4BC9B5 if c & 1 else c >> 1
        table.append(c)
    crc = 0xFFFFFFFFFFFFFFFF
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return base64.b64encode((crc ^ 0xFFFFFFFFFFFFFFFF).to_bytes(8, "big")).decode()


def put_raw(env: S3Env, key: str, body: bytes, checksum: tuple[str, str] | None) -> None:
    """PutObject as S3 receives it from a client that sends ``(algorithm, value)`` (or no
    checksum): without awscrt botocore cannot send CRC64NVME itself, so this is plain HTTP
    (moto's server, authorization off)."""
    headers = {"Content-Type": "application/octet-stream"}
    if checksum:
        headers |= {"x-amz-sdk-checksum-algorithm": checksum[0],
                    f"x-amz-checksum-{checksum[0].lower()}": checksum[1]}
    urllib.request.urlopen(urllib.request.Request(
        f"{env.endpoint}/{env.bucket}/{key}", data=body, method="PUT", headers=headers),
        timeout=30).read()


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
