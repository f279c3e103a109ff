"""The agent's command line (agent/settings.py): one declaration, parser and installer agree."""

from __future__ import annotations

import dataclasses

import pytest

from bootstrap_scripts.agent.settings import (
    OPTIONS,
    AgentConfig,
    build_parser,
    canonical_args,
    config_from_args,
)

REQUIRED = ["--role", "master", "--cluster-id", "c", "--stack-name", "s", "--region", "r",
            "--master-queue-url", "https://sqs/q"]


def test_every_config_field_is_an_option_with_the_same_default():
    assert {o.dest for o in OPTIONS} == {f.name for f in dataclasses.fields(AgentConfig)}
    ns = build_parser().parse_args(REQUIRED[:8])
    for f in dataclasses.fields(AgentConfig):
        if f.default is not dataclasses.MISSING:
            assert getattr(ns, f.name) == f.default, f.name


def test_canonical_args_round_trip_including_empty_values_and_switches():
    config = config_from_args([*REQUIRED, "--wait-handle", "", "--no-mount",
                               "--poll-wait", "3", "--data-prep", "echo 'a b'"])
    args = canonical_args(config)
    assert "--wait-handle=" in args and "--no-mount" in args
    assert config_from_args(args) == config
    assert "--no-mount" not in canonical_args(config_from_args(REQUIRED))


def test_the_worker_queue_option_is_gone():
    with pytest.raises(SystemExit):
        build_parser().parse_args([*REQUIRED, "--worker-queue-url", "https://sqs/w"])


def test_bad_values_are_refused_naming_the_option():
    with pytest.raises(ValueError, match=r"--poll-wait must be 0\.\.20"):
        config_from_args([*REQUIRED, "--poll-wait", "21"])
    with pytest.raises(ValueError, match="--master-queue-url is required"):
        config_from_args(["--role", "master", "--cluster-id", "c", "--stack-name", "s",
                          "--region", "r"])
