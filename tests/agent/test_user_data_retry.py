"""Every download in the node's user data retries with backoff: one refused request (S3
throttling, a mirror not answering yet) must not end the boot script before it signals."""

from __future__ import annotations

import subprocess
from pathlib import Path

from constructs_lib.user_data import (
    DOWNLOAD_ATTEMPTS,
    RETRY_FUNCTION,
    render_bootstrap_commands,
)


def rendered() -> list[str]:
    return render_bootstrap_commands(
        asset_s3_url="s3://bucket/scripts.zip", python="/opt/pytorch/bin/python3",
        efs_utils_install="dnf install -y -q amazon-efs-utils",
        agent_settings={"role": "worker", "cluster-id": "c"})


def test_every_download_goes_through_retry():
    lines = rendered()
    assert lines.index(RETRY_FUNCTION) < min(i for i, ln in enumerate(lines)
                                             if ln.startswith("retry ") or " retry " in ln)
    downloads = [ln for ln in lines if "aws s3 cp" in ln or "dnf install" in ln
                 or "pip install" in ln]
    # the node scripts, amazon-efs-utils, boto3 (when missing), cryptography (signatures
    # checked on the node), py-spy (hung jobs' stacks), tensorboard (jobs' scalars)
    assert len(downloads) == 6 and "cryptography==" in downloads[-3]
    assert "py-spy==" in downloads[-2]
    assert "tensorboard==" in downloads[-1]
    for line in downloads:
        assert line.startswith("retry ") or "|| retry " in line, line


def run_retry(tmp_path: Path, failures: int) -> tuple[subprocess.CompletedProcess, list[int]]:
    """``retry`` on a command that fails ``failures`` times, with ``sleep`` recorded."""
    counter, sleeps = tmp_path / "count", tmp_path / "sleeps"
    counter.write_text("0")
    script = "\n".join([
        "set -euo pipefail",
        f'sleep() {{ echo "$1" >> {sleeps}; }}',
        RETRY_FUNCTION,
        f'flaky() {{ n=$(($(cat {counter}) + 1)); echo $n > {counter}; [ "$n" -gt {failures} ]; }}',
        "retry flaky",
        "echo downloaded",
    ])
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=False)
    waits = [int(x) for x in sleeps.read_text().split()] if sleeps.exists() else []
    return proc, waits


def test_a_download_that_fails_twice_succeeds_after_two_growing_waits(tmp_path):
    proc, waits = run_retry(tmp_path, failures=2)
    assert proc.returncode == 0 and "downloaded" in proc.stdout
    assert waits == [5, 10]
    assert "flaky failed (attempt 1), retrying in 5s" in proc.stderr


def test_a_download_that_keeps_failing_ends_the_script_after_the_last_attempt(tmp_path):
    proc, waits = run_retry(tmp_path, failures=100)
    assert proc.returncode != 0 and "downloaded" not in proc.stdout
    assert len(waits) == DOWNLOAD_ATTEMPTS - 1 and waits == sorted(waits)
    assert f"flaky failed {DOWNLOAD_ATTEMPTS} times, giving up" in proc.stderr
