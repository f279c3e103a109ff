"""Benchmark: how long a job's line takes from its share's log to CloudWatch Logs.

Real processes and real HTTP: the emulator's CloudWatch agent (``python -m
emulator.cloudwatch_agent``) on the configuration the node installer renders, shipping to
moto's server; the executor's copy (``LogMirror.follow``, every 0.2 s as the executor's pass)
runs in this process. Each sample writes one line to a share's log (the EFS file), then
polls FilterLogEvents until the line is there. The agent uploads every
``force_flush_interval`` (5 s, the real agent's default), which dominates. On AWS add
CloudWatch Logs' own ingestion delay. Figures only (``make bench``); no timing assertions.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

import boto3
import pytest

from bootstrap_scripts.agent import cloudwatch_config
from bootstrap_scripts.jobs.executor.log_mirror import LogMirror, share_sources
from bootstrap_scripts.node.procgroup import stop_popen_group
from emulator.deploy import REGION, REPO_ROOT

SAMPLES = 8
EXECUTOR_PASS_SECONDS = 0.2


@pytest.mark.bench
def test_bench_job_line_to_cloudwatch(tmp_path, moto_reset) -> None:
    logs = boto3.client("logs", endpoint_url=moto_reset, region_name=REGION)
    logs.create_log_group(logGroupName="/deeplearning/bench")
    root = tmp_path / "node"
    config = root / cloudwatch_config.CONFIG_PATH
    config.parent.mkdir(parents=True)
    config.write_text(cloudwatch_config.render(root=root, log_group="/deeplearning/bench",
                                               instance_id="i-0bench", master=False))
    nodes = tmp_path / "efs/jobs/b.1/nodes"
    nodes.mkdir(parents=True)
    share_log = nodes / "0.log"
    share_log.write_text("")
    mirror = LogMirror(root)
    running = share_sources("b.1", nodes, "10.0.0.4", [(0, "", "0.log")])
    agent = subprocess.Popen(
        [sys.executable, "-m", "emulator.cloudwatch_agent", "--config", str(config),
         "--state-dir", str(tmp_path / "state")], cwd=REPO_ROOT,
        env={**os.environ, "AWS_ENDPOINT_URL": moto_reset}, stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, process_group=0)
    lags: list[float] = []
    try:
        for k in range(SAMPLES):
            time.sleep(0.7 * k % 3)  # spread the writes over the agent's upload cycle
            marker = f"sample={k}"
            t0 = time.monotonic()
            with open(share_log, "a") as f:
                f.write(marker + "\n")
            next_pass = t0
            while True:
                now = time.monotonic()
                if now >= next_pass:
                    mirror.follow(running)
                    next_pass = now + EXECUTOR_PASS_SECONDS
                found = logs.filter_log_events(logGroupName="/deeplearning/bench",
                                               logStreamNames=["i-0bench/jobs"])["events"]
                if any(marker in e["message"] for e in found):
                    lags.append(time.monotonic() - t0)
                    break
                assert now - t0 < 60, f"{marker} never reached CloudWatch Logs"
                time.sleep(0.05)
    finally:
        stop_popen_group(agent)
    print(f"\njob line -> CloudWatch Logs (emulated agent, flush every "
          f"{cloudwatch_config.FLUSH_SECONDS} s, {SAMPLES} samples): median "
          f"{statistics.median(lags):.1f} s, min {min(lags):.1f} s, max {max(lags):.1f} s")
