"""Handler latency against moto's HTTP server (``make bench``; prints figures, no limits)."""

from __future__ import annotations

import statistics
import time

import pytest
from adjuster_harness import (
    LAUNCH,
    LAUNCH_ERROR,
    Cloud,
    drop_instances,
    fixture_record,
    import_adjuster,
    lambda_environment,
    sns_event,
)

adjuster = import_adjuster()


@pytest.mark.bench
def test_bench_handler_latency(moto_reset: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_reset)
    cloud = Cloud(endpoint_url=moto_reset)
    queue_url = cloud.queue()
    lambda_environment(monkeypatch, queue_url, LOG_LEVEL="ERROR")
    ids = cloud.group("bench-full", min_size=0, desired=16, max_size=16)

    warm: list[float] = []
    for index in range(50):
        started = time.perf_counter()
        result = adjuster.handler(
            sns_event(fixture_record(LAUNCH, "bench-full", ids[index % 16])), None
        )
        warm.append(time.perf_counter() - started)
        assert result["outcomes"] == ["asg-setup-success"]

    lowering: list[float] = []
    for index in range(5):
        name = f"bench-short-{index}"
        cloud.group(name, min_size=0, desired=16, max_size=16)
        drop_instances(name, 4)
        started = time.perf_counter()
        adjuster.handler(sns_event(fixture_record(LAUNCH_ERROR, name)), None)
        lowering.append(time.perf_counter() - started)
        assert cloud.desired(name) == 12

    print(
        f"\ncapacity adjuster (moto server, 16-instance groups): launch at desired → asg-setup "
        f"median {statistics.median(warm) * 1000:.1f} ms, max {max(warm) * 1000:.1f} ms "
        f"(n={len(warm)}); launch error → lower 16→12, re-read, asg-setup median "
        f"{statistics.median(lowering) * 1000:.1f} ms (n={len(lowering)})"
    )
