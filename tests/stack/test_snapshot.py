"""One snapshot per stack, asset hashes masked so CDK upgrades and code edits do not churn it.

Update after an intended change with:
    .venv/bin/pytest tests/stack/test_snapshot.py --snapshot-update
"""

from __future__ import annotations

import json
import re

import pytest
from syrupy.extensions.json import JSONSnapshotExtension

from tests.stack.synth import cluster_template

_HASH = re.compile(r"[0-9a-f]{64}")


def masked(template: dict) -> dict:
    return json.loads(_HASH.sub("<asset-hash>", json.dumps(template, sort_keys=True)))


@pytest.fixture()
def snapshot_json(snapshot):
    return snapshot.use_extension(JSONSnapshotExtension)


def test_dl_cluster_stack_snapshot(snapshot_json) -> None:
    assert masked(cluster_template().to_json()) == snapshot_json
