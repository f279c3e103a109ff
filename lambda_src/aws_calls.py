"""The few AWS calls the adjuster makes, with errors sorted into retryable and not.

Only a failure that a later attempt can fix (throttling, a 5xx, a dropped connection, an
SQS send that did not go through) may make the invocation fail, so Lambda's asynchronous
retry runs it again; retries are harmless because every decision is recomputed from the
group's state. Anything else (access denied, validation errors) is logged by the caller and
the record is skipped, so one bad record cannot put the function into a retry loop.

Permissions used (the construct grants exactly these, see docs/capacity-adjuster.md):
``autoscaling:DescribeAutoScalingGroups``, ``autoscaling:SetDesiredCapacity`` (conditioned
on the cluster tag) and ``sqs:SendMessage`` on the master queue; for a single-zone cluster
with zone fallback also ``autoscaling:UpdateAutoScalingGroup`` (the cluster tag and its own
subnets) and ``autoscaling:TerminateInstanceInAutoScalingGroup`` (the cluster tag).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import boto3
from botocore.config import Config as BotoConfig
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
)

RETRYABLE_CODES = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "RequestLimitExceeded",
        "TooManyRequestsException",
        "SlowDown",
        "ServiceUnavailable",
        "InternalFailure",
        "InternalError",
        "RequestTimeout",
        "RequestTimeoutException",
        "ScalingActivityInProgress",
        "ResourceContention",
    }
)
_RETRYABLE_TRANSPORT = (
    EndpointConnectionError,
    ConnectionClosedError,
    ConnectTimeoutError,
    ReadTimeoutError,
)

#: botocore retries throttling itself ("standard" mode); our own retry is Lambda's.
_BOTO_CONFIG = BotoConfig(
    retries={"max_attempts": 4, "mode": "standard"}, connect_timeout=5, read_timeout=15
)


_CLIENT_ENV = (
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_AUTO_SCALING",
    "AWS_ENDPOINT_URL_SQS",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ACCESS_KEY_ID",
    "AWS_SESSION_TOKEN",
)
_CLIENT_CACHE: dict[tuple[str, ...], AwsClients] = {}


class AwsCallFailed(Exception):
    """An AWS call failed in a way a retry will not fix; ``code`` names the error."""

    def __init__(self, what: str, code: str, detail: str) -> None:
        super().__init__(f"{what} failed: {code}: {detail}")
        self.what, self.code, self.detail = what, code, detail


class RetryableFailure(Exception):
    """A failure worth a Lambda retry (raised only after every record was processed)."""


def _classify(what: str, exc: Exception) -> Exception:
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", "Unknown"))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0
        if code in RETRYABLE_CODES or int(status) >= 500:
            return RetryableFailure(f"{what}: {code}: {error.get('Message', '')}")
        return AwsCallFailed(what, code, str(error.get("Message", "")))
    if isinstance(exc, _RETRYABLE_TRANSPORT):
        return RetryableFailure(f"{what}: {type(exc).__name__}: {exc}")
    return AwsCallFailed(what, type(exc).__name__, str(exc))


@dataclass
class AwsClients:
    """boto3 clients; ``AWS_ENDPOINT_URL`` (moto, the local emulator) is honoured by boto3."""

    autoscaling: Any
    sqs: Any

    @classmethod
    def from_environment(cls) -> AwsClients:
        """Clients for the current environment, reused across warm invocations.

        Creating two boto3 clients costs ~100 ms; a warm Lambda environment keeps them.
        The cache key holds everything boto3 reads from the environment that could change
        between invocations in one process (tests switch endpoints and regions).
        """
        key = tuple(os.environ.get(name, "") for name in _CLIENT_ENV)
        clients = _CLIENT_CACHE.get(key)
        if clients is None:
            session = boto3.session.Session()
            clients = cls(
                autoscaling=session.client("autoscaling", config=_BOTO_CONFIG),
                sqs=session.client("sqs", config=_BOTO_CONFIG),
            )
            _CLIENT_CACHE.clear()
            _CLIENT_CACHE[key] = clients
        return clients

    def describe_group(self, name: str) -> dict[str, Any] | None:
        """The group's description, or None when no such group exists (any more)."""
        try:
            response = self.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[name])
        except (ClientError, BotoCoreError) as exc:
            raise _classify("autoscaling:DescribeAutoScalingGroups", exc) from exc
        for group in response.get("AutoScalingGroups") or []:
            if group.get("AutoScalingGroupName") == name:
                return group
        return None

    def set_desired_capacity(self, name: str, desired: int) -> None:
        # HonorCooldown=False: the change is a correction, not a scaling decision to defer.
        try:
            self.autoscaling.set_desired_capacity(
                AutoScalingGroupName=name, DesiredCapacity=desired, HonorCooldown=False
            )
        except (ClientError, BotoCoreError) as exc:
            raise _classify("autoscaling:SetDesiredCapacity", exc) from exc

    def cluster_groups(self, tag_key: str, cluster_id: str) -> list[dict[str, Any]]:
        """Every group tagged ``tag_key=cluster_id`` (the master and the worker group)."""
        try:
            pages = self.autoscaling.get_paginator("describe_auto_scaling_groups").paginate(
                Filters=[{"Name": f"tag:{tag_key}", "Values": [cluster_id]}])
            return [g for page in pages for g in page.get("AutoScalingGroups") or []]
        except (ClientError, BotoCoreError) as exc:
            raise _classify("autoscaling:DescribeAutoScalingGroups", exc) from exc

    def move_group(self, name: str, subnet: str, placement_group: str) -> None:
        """Point the group at one subnet (and that zone's placement group)."""
        params: dict[str, Any] = {"AutoScalingGroupName": name, "VPCZoneIdentifier": subnet}
        if placement_group:
            params["PlacementGroup"] = placement_group
        try:
            self.autoscaling.update_auto_scaling_group(**params)
        except (ClientError, BotoCoreError) as exc:
            raise _classify("autoscaling:UpdateAutoScalingGroup", exc) from exc

    def replace_instance(self, instance_id: str) -> None:
        """Terminate one instance; its group launches the replacement (desired unchanged)."""
        try:
            self.autoscaling.terminate_instance_in_auto_scaling_group(
                InstanceId=instance_id, ShouldDecrementDesiredCapacity=False)
        except (ClientError, BotoCoreError) as exc:
            raise _classify("autoscaling:TerminateInstanceInAutoScalingGroup", exc) from exc

    def send(self, queue_url: str, message: dict[str, Any]) -> str:
        """Send one message; every failure is retryable (the master must not miss it)."""
        try:
            response = self.sqs.send_message(
                QueueUrl=queue_url, MessageBody=json.dumps(message, sort_keys=True)
            )
        except (ClientError, BotoCoreError) as exc:
            raise RetryableFailure(f"sqs:SendMessage to {queue_url}: {exc}") from exc
        return str(response.get("MessageId", ""))
