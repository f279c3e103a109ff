"""The setup wait (the stack's wait condition) follows the boot budget and the zone moves: a
p5 cluster whose nodes take 20 minutes to boot, moved twice, still forms before the stack
gives up (constructs_lib/user_data.py ``setup_wait``; docs/capacity.md, "The setup wait")."""

from __future__ import annotations

import pytest
from aws_cdk.assertions import Template

from constructs_lib.user_data import (
    FORMING_SECONDS,
    MAX_SETUP_WAIT_SECONDS,
    ZONE_MOVE_SECONDS,
    setup_wait,
)
from constructs_lib.validation import ConfigError
from tests.stack.synth import cluster_template


def wait_and_agent_timeout(t: Template) -> tuple[str, set[str]]:
    ((_, wc),) = t.find_resources("AWS::CloudFormation::WaitCondition").items()
    flags = set()
    for lt in t.find_resources("AWS::EC2::LaunchTemplate").values():
        parts = lt["Properties"]["LaunchTemplateData"]["UserData"]["Fn::Base64"]["Fn::Join"][1]
        text = "".join(p for p in parts if isinstance(p, str))
        flags |= {w for w in text.split("--setup-timeout ")[1:2]}
    return wc["Properties"]["Timeout"], {f.split()[0] for f in flags}


def test_the_defaults_keep_the_55_minute_wait() -> None:
    assert wait_and_agent_timeout(cluster_template()) == ("3300", {"'3300'"})


def test_two_zone_moves_of_20_minute_p5_boots_fit_in_the_wait() -> None:
    """600 s of Auto Scaling's retries in the first zone, two moves, then the master's boot
    and its wait for the workers (20 minutes each) and forming: 3900 s, not 3300 s."""
    t = cluster_template(workerInstanceType="p5.48xlarge", nodeBootSeconds="1200",
                         placementGroup="true", maxZoneMoves="2")
    need = 600 + 2 * ZONE_MOVE_SECONDS + 2 * 1200 + FORMING_SECONDS
    assert need == 3900
    assert wait_and_agent_timeout(t) == ("3900", {"'3900'"})


def test_the_longest_settings_still_fit_in_12_hours() -> None:
    """The settings' own bounds (nodeBootSeconds 3000, launchRetrySeconds 3299,
    maxZoneMoves 10) give a wait CloudFormation accepts."""
    assert setup_wait(3000, 3299, 10) == 3299 + 10 * 300 + 6000 + 300 <= MAX_SETUP_WAIT_SECONDS


def test_past_12_hours_is_refused_with_the_arithmetic() -> None:
    with pytest.raises(ConfigError, match=r"= 43500 s, is longer than the 43200 s"):
        setup_wait(21000, 600, 2)
    with pytest.raises(ConfigError, match="setup_timeout_seconds must be at most 43200"):
        setup_wait(900, 600, 2, given=43201)
    assert setup_wait(3000, 600, 2, given=4000) == 4000  # a construct's own value is kept
