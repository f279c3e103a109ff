"""AWS access for the EMR membership watcher: boto3 when importable, else the AWS CLI.

The system Python of an EMR node may lack boto3 while the AWS CLI is always there, so the
watcher talks to EMR and EC2 through :func:`make_client`, which returns either a boto3 client
or a :class:`CliClient` with the same call shape (``client.list_instances(ClusterId=...)``).
"""

from __future__ import annotations

import json
import subprocess
from typing import Any


class AwsCliError(RuntimeError):
    """An ``aws`` command failed; the message names the operation, its exit status and stderr."""


class CliClient:
    """The few boto3 client calls we need, through ``aws <service> <op> --param value``.

    The CLI paginates by itself, so a list call returns every item in one answer.
    """

    def __init__(self, service: str, region: str | None = None, aws: str = "aws"):
        self.service, self.region, self.aws = service, region, aws

    def __getattr__(self, method: str):
        if method.startswith("_"):
            raise AttributeError(method)
        operation = method.replace("_", "-")

        def call(**params: Any) -> dict:
            cmd = [self.aws, self.service, operation, "--output", "json"]
            if self.region:
                cmd += ["--region", self.region]
            for key, value in params.items():
                cmd.append("--" + kebab(key))
                if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
                    cmd += list(value)
                elif isinstance(value, str):
                    cmd.append(value)
                else:
                    cmd.append(json.dumps(value))
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise AwsCliError(f"'aws {self.service} {operation}' failed "
                                  f"(exit {proc.returncode}): {proc.stderr.strip()[:500]}")
            return json.loads(proc.stdout or "{}")

        return call


def kebab(name: str) -> str:
    """``InstanceGroupTypes`` -> ``instance-group-types`` (the CLI's option names)."""
    out = []
    for i, ch in enumerate(name):
        if ch.isupper() and i and not name[i - 1].isupper():
            out.append("-")
        out.append(ch.lower())
    return "".join(out)


def make_client(service: str, region: str | None) -> Any:
    """A boto3 client for ``service``, or a :class:`CliClient` where boto3 is missing."""
    try:
        import boto3
    except ImportError:
        return CliClient(service, region)
    return boto3.client(service, region_name=region)


def list_all(client: Any, method: str, key: str, **params: Any) -> list[dict]:
    """Every item of a paginated list call (boto3's paginator, or the CLI's own pagination)."""
    if isinstance(client, CliClient):
        return list(getattr(client, method)(**params).get(key, []))
    items: list[dict] = []
    for page in client.get_paginator(method).paginate(**params):
        items.extend(page.get(key, []))
    return items
