"""The job controller's one AWS call: tell Auto Scaling that a node's instance is unhealthy.

``SetInstanceHealth(HealthStatus=Unhealthy, ShouldRespectGracePeriod=False)``: Auto Scaling
then terminates the instance and launches a replacement to keep the group's desired
capacity; the capacity adjuster and the master agent handle the rest (the node leaves the
membership, the replacement joins), exactly as for an instance that failed its EC2 status
checks. The master's role may call it only on groups tagged with this cluster's id.
"""

from __future__ import annotations

import logging
from typing import Any

LOG = logging.getLogger("dl-controller")


class InstanceHealth:
    """A lazily created Auto Scaling client (boto3 costs ~0.5 s of CPU to import and build:
    only paid when a node actually fails)."""

    def __init__(self, region: str) -> None:
        self.region = region
        self._client: Any = None

    def client(self) -> Any:
        if self._client is None:
            import boto3

            self._client = boto3.session.Session(region_name=self.region or None).client(
                "autoscaling")
        return self._client

    def mark_unhealthy(self, instance_id: str) -> str:
        """Mark ``instance_id`` Unhealthy; returns "" on success, else the error (logged, not
        raised: a failed call must not stop the job's restart)."""
        try:
            self.client().set_instance_health(InstanceId=instance_id, HealthStatus="Unhealthy",
                                              ShouldRespectGracePeriod=False)
        except Exception as exc:  # botocore's errors, no credentials, no network: all reported
            LOG.error("SetInstanceHealth(%s, Unhealthy) failed: %s", instance_id, exc)
            return f"SetInstanceHealth failed: {exc}"
        LOG.info("marked instance %s Unhealthy: Auto Scaling replaces it", instance_id)
        return ""
