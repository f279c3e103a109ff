"""The job controller's one AWS call: tell Auto Scaling that a node's instance is unhealthy,
behind the cluster's circuit breaker.

``SetInstanceHealth(HealthStatus=Unhealthy, ShouldRespectGracePeriod=False)``: Auto Scaling
then terminates the instance and launches a replacement to keep the group's desired
capacity; the capacity adjuster and the master agent handle the rest (the node leaves the
membership, the replacement joins), exactly as for an instance that failed its EC2 status
checks. The master's role may call it only on groups tagged with this cluster's id.

The circuit breaker (:func:`breaker`, pure): at most ``max_per_hour`` instances marked in any
hour (the stack's ``maxReplacementsPerHour``), so that no storm of failures (a bug in the
product's fault detection, a user who found a way to fake one) can drain the cluster: past
it a failure is still recorded and the job still restarts, but no instance is marked. The
marks of the last hour travel in the controller's heartbeat (``cluster/controller.json``),
so a restarted controller (or a new master's) keeps counting.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

LOG = logging.getLogger("dl-controller")
#: Instances the controller may have replaced in one hour unless the stack says otherwise.
DEFAULT_MAX_REPLACEMENTS_PER_HOUR = 3
WINDOW_SECONDS = 3600.0
#: How a refused mark starts (in the restart record's ``health_error``).
BREAKER_OPEN = "circuit breaker open"


def breaker(marks: Iterable[float], *, now: float, max_per_hour: int) -> str:
    """Why no further instance may be marked now ("" when one may): ``marks`` are the
    times of earlier marks; those within the last hour count."""
    recent = sum(1 for at in marks if now - WINDOW_SECONDS < at <= now)
    if recent >= max_per_hour:
        return (f"{BREAKER_OPEN}: {recent} instance(s) marked Unhealthy in the last hour "
                f"(maxReplacementsPerHour {max_per_hour}); not replacing another")
    return ""


class InstanceHealth:
    """A lazily created Auto Scaling client (boto3 costs ~0.5 s of CPU to import and build:
    only paid when a node actually fails) and the breaker's marks."""

    def __init__(self, region: str, *,
                 max_per_hour: int = DEFAULT_MAX_REPLACEMENTS_PER_HOUR,
                 marks: Iterable[float] = ()) -> None:
        if max_per_hour < 0:
            raise ValueError(f"--max-replacements-per-hour must be >= 0, got {max_per_hour}")
        self.region = region
        self.max_per_hour = max_per_hour
        #: when this cluster's controller marked instances (the last hour's, oldest first)
        self.marks: list[float] = sorted(marks)
        #: the instances this controller marked, and when (``UnhealthyNodes``: the ones
        #: still in the membership, i.e. not yet replaced); not carried over to a successor
        self.marked: dict[str, float] = {}
        self._client: Any = None

    def client(self) -> Any:
        if self._client is None:
            import boto3

            self._client = boto3.session.Session(region_name=self.region or None).client(
                "autoscaling")
        return self._client

    def recent_marks(self) -> tuple[float, ...]:
        """The marks that still count (what the heartbeat carries)."""
        now = time.time()
        self.marks = [at for at in self.marks if now - at < WINDOW_SECONDS]
        return tuple(self.marks)

    def marked_instances(self) -> frozenset[str]:
        """The instances this controller marked Unhealthy within the last hour."""
        now = time.time()
        self.marked = {i: at for i, at in self.marked.items() if now - at < WINDOW_SECONDS}
        return frozenset(self.marked)

    def mark_unhealthy(self, instance_id: str) -> str:
        """Mark ``instance_id`` Unhealthy; returns "" on success, else why not (the breaker
        is open, or the call failed: logged, not raised, since a refused or failed call must
        not stop the job's restart)."""
        tripped = breaker(self.marks, now=time.time(), max_per_hour=self.max_per_hour)
        if tripped:
            LOG.error("not marking instance %s Unhealthy: %s", instance_id, tripped)
            return tripped
        try:
            self.client().set_instance_health(InstanceId=instance_id, HealthStatus="Unhealthy",
                                              ShouldRespectGracePeriod=False)
        except Exception as exc:  # botocore's errors, no credentials, no network: all reported
            LOG.error("SetInstanceHealth(%s, Unhealthy) failed: %s", instance_id, exc)
            return f"SetInstanceHealth failed: {exc}"
        self.marks.append(time.time())
        self.marked[instance_id] = self.marks[-1]
        LOG.info("marked instance %s Unhealthy: Auto Scaling replaces it", instance_id)
        return ""
