"""A node root with a region file and the AMI's /var/tmp, and an S3 bucket on moto's server
(over HTTP) for the staging tests."""

from __future__ import annotations

import base64
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest

from bootstrap_scripts.data import stage
from bootstrap_scripts.node import node_region


@dataclass
class S3Env:
    endpoint: str
    root: Path
    bucket: str
    s3: object

    def put(self, key: str, body: bytes) -> None:
        self.s3.put_object(Bucket=self.bucket, Key=key, Body=body)  # type: ignore[attr-defined]


def run_stage(env: S3Env, source: str, **kwargs) -> dict:
    """The real stager in this process on ``env``'s node root (rank 0 of 1, 8 transfers at
    once unless given): its result record, or its StageError."""
    kwargs.setdefault("rank", 0)
    kwargs.setdefault("shard_count", 1)
    kwargs.setdefault("concurrency", 8)
    return stage.stage(source, root=str(env.root), **kwargs)


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


def node_root(path: Path, region: str = "us-east-1") -> Path:
    """What the installer leaves on a node: the region file; and the AMI's /var/tmp."""
    env = node_region.env_file(path)
    env.parent.mkdir(parents=True)
    env.write_text(node_region.render_env_file(region))
    (path / "var/tmp").mkdir(parents=True)
    (path / "var/tmp").chmod(0o1777)
    return path


@pytest.fixture()
def s3env(moto_reset: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Env]:
    # boto3 finds moto's server through AWS_ENDPOINT_URL, as the emulated nodes' processes do
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_reset)
    s3 = boto3.client("s3", endpoint_url=moto_reset, region_name="us-east-1")
    s3.create_bucket(Bucket="training-data")
    yield S3Env(moto_reset, node_root(tmp_path / "node"), "training-data", s3)
