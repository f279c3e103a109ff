"""The emulated machine's systemd (``emulator.units.restart_policy``): which ended units it
starts again, read from the units the real installer writes."""

from __future__ import annotations

import pytest

from bootstrap_scripts.agent import install
from emulator.units import restart_policy


@pytest.fixture(scope="module")
def units(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("node")
    with pytest.MonkeyPatch.context() as mp:
        # No instance metadata here: without botocore's switch the installer asks IMDS for
        # the region for 30 s before it falls back to --region (install.IMDS_DEADLINE_SECONDS).
        mp.setenv("AWS_EC2_METADATA_DISABLED", "true")
        install.install(["--role", "master", "--cluster-id", "c", "--stack-name", "c",
                         "--region", "us-east-1", "--master-queue-url", "https://sqs/q",
                         "--efs-id", "fs-1", "--mount-point", "/efs", "--wait-handle", "",
                         "--setup-timeout", "3300", "--root", str(root), "--no-systemctl"])
    unit_dir = root / "etc/systemd/system"
    return {p.stem: p.read_text() for p in unit_dir.glob("*.service")}


@pytest.mark.parametrize(("unit", "returncode", "restarted"), [
    ("dl-agent", 1, True),  # a crash: on-failure restarts it
    ("dl-agent", -9, True),  # killed by a signal: a failure to systemd
    ("dl-agent", 0, False),  # stopped cleanly
    ("dl-agent", 2, False),  # the setup failed and the wait condition was told
    ("dl-agent", 64, False),  # bad arguments
    ("dl-executor", 0, True),  # Restart=always
    ("dl-controller", 1, True),  # e.g. started before the membership existed
])
def test_which_ended_units_systemd_starts_again(units, unit, returncode, restarted):
    policy = restart_policy(units[unit])
    assert policy.wants(returncode) is restarted
    assert policy.seconds == 5.0


def test_a_unit_without_restart_stays_down():
    assert not restart_policy("[Service]\nExecStart=/bin/true\n").wants(1)
