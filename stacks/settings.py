"""Turn CDK context values (strings from `-c key=value`, or JSON from cdk.json) into settings.

Each key, its default, its bounds and its check are described once, in
``constructs_lib.cluster_settings.ClusterSettings``; this module adds what spans several
keys. Every bad value fails synth with a message naming the context key, the value and the
limit; unset keys keep the defaults, which are the construct's own.
"""

from __future__ import annotations

from collections.abc import Callable

from constructs_lib import validation
from constructs_lib.cluster_settings import ClusterSettings
from constructs_lib.setting import context_keys
from stacks.context import ContextReader

#: context key -> ClusterSettings field (derived from the field descriptions).
CONTEXT_KEYS: dict[str, str] = context_keys(ClusterSettings)
#: The keys of README "When capacity is short".
CAPACITY_CONTEXT_KEYS: dict[str, str] = {
    k: v for k, v in CONTEXT_KEYS.items()
    if k in ("workerInstanceTypes", "masterInstanceTypes", "capacityReservationId",
             "capacityReservationGroupArn", "capacityBlockId", "availabilityZones",
             "maxZoneMoves")}


def settings_from_context(get: Callable[[str], object]) -> ClusterSettings:
    """Build the stack's settings from a context getter (``app.node.try_get_context``)."""
    ctx = ContextReader(get)
    ctx.one_of(("workerInstanceType", "workerInstanceTypes"),
               ("masterInstanceType", "masterInstanceTypes"),
               ("capacityReservationId", "capacityReservationGroupArn", "capacityBlockId"))
    settings = ctx.settings(ClusterSettings)
    if settings.ssh_cidr and not settings.ssh_allow_wide_cidr:
        ctx.checked("sshCidr", lambda n, v: validation.ssh_cidr(
            n, v, wide_opt_in="sshAllowWideCidr"))
    needed = settings.worker_count + settings.spot_workers
    if settings.max_workers is not None and settings.max_workers < needed:
        raise validation.ConfigError(
            f"context key 'maxWorkers' must be at least workerCount + spotWorkers ({needed}), "
            f"got {settings.max_workers}"
        )
    return settings
