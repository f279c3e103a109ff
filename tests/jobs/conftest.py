"""Fixtures for managed-job tests: emulated clusters whose processes never outlive the test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.cluster import LocalCluster, start_local_cluster


@pytest.fixture()
def emu(tmp_path: Path) -> Iterator[Callable[..., LocalCluster]]:
    """Factory: ``emu(n_nodes, instances=None)`` -> a LocalCluster (nothing started yet).

    Teardown stops every process it started, the controllers' attempt runners included, and
    fails the test if any of them, or any process of a job share, is still alive."""
    clusters: list[LocalCluster] = []

    def factory(n_nodes: int, **kwargs) -> LocalCluster:
        c = start_local_cluster(tmp_path / f"cluster{len(clusters)}", n_nodes, **kwargs)
        clusters.append(c)
        return c

    yield factory
    leftovers = set()
    for c in clusters:
        c.stop()
        leftovers |= c.leftovers()
    assert not leftovers, f"processes left behind: {sorted(leftovers)}"
