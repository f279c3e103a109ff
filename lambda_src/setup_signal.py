"""Failing the stack's setup when the master itself cannot launch.

Every other setup failure reaches the master agent on the master queue, and the agent
signals the stack's wait condition. A master instance that never launched has no agent:
its ``asg-setup`` failure would sit on the queue until the wait condition times out (55
minutes). So for the master group, the adjuster signals the wait-condition handle itself
(``WAIT_HANDLE_URL``, the handle's presigned URL), with the same reason the agent would
give: the group, the adjuster's reason with EC2's message, the activity's cause, and every
zone and instance type that was tried.

Only before the cluster formed: the master agent protects the master and base workers from
scale-in when it publishes the first membership, so a protected instance in either group
means the wait condition was already signalled, and a later failure is the agent's (and
the master queue's) business.

The signal is what ``cfn-signal`` sends: a JSON body (``Status``, ``Reason``, ``UniqueId``,
``Data``) PUT with an EMPTY Content-Type, because the presigned signature covers that
header (https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/using-cfn-waitcondition.html).
"""

from __future__ import annotations

import datetime as dt
import json
import urllib.error
import urllib.request
from typing import Any

try:  # imported as lambda_src.setup_signal (tests, installed package)
    from .aws_calls import AwsClients, RetryableFailure
    from .json_log import JsonLogger
except ImportError:  # imported as setup_signal (Lambda: the asset root is on sys.path)
    from aws_calls import AwsClients, RetryableFailure  # type: ignore[no-redef]
    from json_log import JsonLogger  # type: ignore[no-redef]

#: The signal's UniqueId: one signaller besides the master agent.
UNIQUE_ID = "capacity-adjuster"
#: CloudFormation keeps the start of a long reason; the useful part comes first.
MAX_REASON = 4000
MAX_CAUSE_CHARS = 300


def created_at(group: dict[str, Any]) -> float | None:
    """The group's ``CreatedTime`` as a UNIX time (None when absent or unreadable); a time
    without a zone is UTC."""
    value = group.get("CreatedTime")
    if isinstance(value, str):
        try:
            value = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    if not isinstance(value, dt.datetime):
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return value.timestamp()


def _attempt(item: dict[str, Any]) -> str:
    types = "/".join(str(t) for t in item.get("instance_types") or [])
    cause = str(item.get("cause") or "failed")
    if len(cause) > MAX_CAUSE_CHARS:
        cause = cause[:MAX_CAUSE_CHARS - 3] + "..."
    moved = " (moved to the next zone)" if item.get("decision") == "move" else ""
    return f"zone {item.get('zone') or '?'}" + (f", {types}" if types else "") + \
        f": {cause}{moved}"


def failure_reason(message: dict[str, Any], zones: list[str] | None = None) -> str:
    """The wait-condition reason for an ``asg-setup`` failure message (the master agent's
    wording: group, reason, cause, what was tried), and the zones the group launches in
    (Auto Scaling tried each of them; the notification names one)."""
    cause = f" ({message['cause']})" if message.get("cause") else ""
    reason = (f"{message['role']} group {message['asg']}: {message['reason']}{cause}")
    if message.get("attempts"):
        reason += "; tried: " + "; ".join(_attempt(a) for a in message["attempts"])
    if zones:
        reason += f"; the group's zones: {', '.join(zones)}"
    return reason[:MAX_REASON]


def signal_body(reason: str) -> bytes:
    return json.dumps({"Status": "FAILURE", "Reason": reason[:MAX_REASON],
                       "UniqueId": UNIQUE_ID, "Data": ""}).encode()


def _formed(groups: list[dict[str, Any]]) -> bool:
    return any(bool(i.get("ProtectedFromScaleIn")) for g in groups
               for i in g.get("Instances") or [] if isinstance(i, dict))


def fail_setup(handle_url: str, message: dict[str, Any], *, clients: AwsClients,
               cluster_id: str, tag_key: str, log: JsonLogger) -> bool:
    """Signal FAILURE with the message's reason, unless the cluster formed; True if sent.
    A signal that does not go through is retryable (Lambda runs the event again)."""
    if not handle_url.lower().startswith(("https://", "http://")):
        log.warning("setup-signal-skipped", reason="not-a-url", handle=handle_url[:100])
        return False
    groups = clients.cluster_groups(tag_key, cluster_id)
    if _formed(groups):
        log.info("setup-signal-skipped", reason="cluster-formed")
        return False
    group = next((g for g in groups if g.get("AutoScalingGroupName") == message["asg"]), {})
    reason = failure_reason(message, [str(z) for z in group.get("AvailabilityZones") or []])
    request = urllib.request.Request(handle_url, data=signal_body(reason), method="PUT",
                                     headers={"Content-Type": ""})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()
    except (urllib.error.URLError, OSError) as exc:
        raise RetryableFailure(f"wait-condition signal: {exc}") from exc
    log.info("setup-failed-signalled", status="FAILURE", reason=reason)
    return True
