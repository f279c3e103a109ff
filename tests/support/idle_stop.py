"""Idle stop's test set-up: clocks moved by hand and the worker group as moto reports it."""

from __future__ import annotations


class Clocks:
    """A wall clock and a monotonic one the test moves by hand."""

    def __init__(self) -> None:
        self.wall, self.mono = 1_000_000.0, 100.0

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds


def group(cluster) -> dict:
    return cluster.client("autoscaling").describe_auto_scaling_groups(
        AutoScalingGroupNames=[cluster.worker_asg])["AutoScalingGroups"][0]

