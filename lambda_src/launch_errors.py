"""Why a launch failed, and whether waiting can fix it (pure functions, no AWS calls).

An ``EC2_INSTANCE_LAUNCH_ERROR`` notification is not the end of a launch: Auto Scaling keeps
the group's desired capacity and tries again, and a launch that failed because EC2 had no
capacity for the type, or because the account's API calls were throttled, usually succeeds
minutes later. Lowering the group on the first such error would shrink the cluster for
good. A configuration error (an AMI that does not exist, an account quota, an invalid or
unsupported parameter) fails every retry the same way, so waiting only delays the failure.

Auto Scaling copies EC2's error into the notification's ``StatusMessage``. A mixed
instances group (an EC2 Fleet launch) puts the error code in it ("Could not launch
On-Demand Instances. InsufficientInstanceCapacity - We currently do not have ..."); a
group with one launch template type gives EC2's text only ("We currently do not have
sufficient p5.48xlarge capacity ...", "You have requested more vCPU capacity than your
current vCPU limit ..."). So the code is read when present, else the text is matched.

Classes (EC2's error codes: https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html,
Auto Scaling's launch failures:
https://docs.aws.amazon.com/autoscaling/ec2/userguide/ts-as-instancelaunchfailure.html):

- ``transient``: EC2 had no capacity (``InsufficientInstanceCapacity`` and its kin), the
  request was throttled (``RequestLimitExceeded``), or EC2 was briefly unavailable. Left to
  the group's own retries for ``LAUNCH_RETRY_SECONDS``.
- ``final``: an account quota (``InstanceLimitExceeded``, ``VcpuLimitExceeded``,
  ``MaxSpotInstanceCountExceeded``), a missing or invalid resource (``InvalidAMIID.*``,
  ``InvalidParameter*``, ``Invalid*.NotFound``), an unsupported combination
  (``Unsupported*``), a full subnet or a missing permission. Acted on at once; for
  ``VcpuLimitExceeded`` the reason names the quota and the command that raises it
  (``lambda_src.quota_classes``).
- ``unknown``: anything else. Treated as transient (the wait is bounded), because lowering
  the group for an error that would have passed is the mistake that cannot be undone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

try:  # imported as lambda_src.launch_errors (tests, installed package)
    from . import quota_classes
except ImportError:  # imported as launch_errors (Lambda: the asset root is on sys.path)
    import quota_classes  # type: ignore[no-redef]

TRANSIENT, FINAL, UNKNOWN = "transient", "final", "unknown"

#: EC2 error codes a later attempt can get past.
TRANSIENT_CODES = frozenset({
    "InsufficientInstanceCapacity", "InsufficientCapacity", "InsufficientHostCapacity",
    "InsufficientReservedInstanceCapacity", "InsufficientCapacityOnHost",
    "RequestLimitExceeded", "Throttling", "ServiceUnavailable", "Unavailable",
    "InternalError", "InternalFailure", "PendingVerification",
})
#: EC2 error codes no retry gets past (quotas, configuration).
FINAL_CODES = frozenset({
    "InstanceLimitExceeded", "VcpuLimitExceeded", "MaxSpotInstanceCountExceeded",
    "InsufficientFreeAddressesInSubnet", "UnauthorizedOperation", "AuthFailure",
    "OptInRequired", "Blocked", "InvalidInstanceType",
})
#: Code prefixes of configuration errors (``InvalidAMIID.NotFound``, ``InvalidParameterValue``,
#: ``InvalidKeyPair.NotFound``, ``Unsupported``, ``UnsupportedOperation``, ...).
FINAL_PREFIXES = ("Invalid", "Unsupported")

#: EC2's texts, for a group whose StatusMessage carries no code: (phrase, code), first wins.
TEXT_CODES: tuple[tuple[str, str], ...] = (
    ("do not have sufficient", "InsufficientInstanceCapacity"),
    ("insufficient capacity", "InsufficientInstanceCapacity"),
    ("request limit exceeded", "RequestLimitExceeded"),
    ("rate exceeded", "Throttling"),
    ("vcpu limit", "VcpuLimitExceeded"),
    ("more vcpu capacity", "VcpuLimitExceeded"),
    ("instance limit", "InstanceLimitExceeded"),
    ("you have requested more instances", "InstanceLimitExceeded"),
    ("image id", "InvalidAMIID.NotFound"),
    ("invalid id: \"ami-", "InvalidAMIID.Malformed"),
    ("is not supported in your requested availability zone", "Unsupported"),
    ("requested configuration is currently not supported", "Unsupported"),
    ("not enough free addresses", "InsufficientFreeAddressesInSubnet"),
    ("key pair", "InvalidKeyPair.NotFound"),
    ("not authorized", "UnauthorizedOperation"),
    ("invalid parameter", "InvalidParameterValue"),
)
#: "... Instances. <Code> - <message>" (EC2 Fleet, mixed instances groups) or "<Code>: ...".
_CODE = re.compile(r"(?:^|[.\s])([A-Z][A-Za-z]+(?:\.[A-Za-z]+)*)\s*(?: - |: )")


@dataclass(frozen=True)
class LaunchError:
    """A launch error's class (``transient`` / ``final`` / ``unknown``), EC2's code ("" when
    neither the code nor a known text is in the message) and the message itself."""

    kind: str
    code: str
    message: str

    @property
    def retryable(self) -> bool:
        """Worth waiting for the group's own retries (a bounded time)."""
        return self.kind != FINAL

    def describe(self, window: float = 0, instance_types: tuple[str, ...] = ()) -> str:
        """What the adjuster made of the error, for the reason it reports: the code, and
        whether it was retried (for ``window`` seconds) or is final; for a vCPU quota, the
        next step (the quota of ``instance_types``, the group's types, and the command)."""
        code = self.code or "unrecognised error"
        if self.code == "VcpuLimitExceeded":
            return (f"{code}: the account's vCPU quota, retries cannot fix it; next step: "
                    f"{quota_classes.increase_step(instance_types)}")
        if self.kind == FINAL:
            return f"{code}: a configuration or quota error, retries cannot fix it"
        if window > 0:
            return f"{code}: still failing after Auto Scaling retried for {window:.0f} s"
        return code


def error_code(status_message: str) -> str:
    """EC2's error code in the message, else the code its known text stands for ("")."""
    text = status_message or ""
    for match in _CODE.finditer(text):
        code = match.group(1)
        if code in TRANSIENT_CODES or code in FINAL_CODES or code.startswith(FINAL_PREFIXES):
            return code
    lowered = text.lower()
    return next((code for phrase, code in TEXT_CODES if phrase in lowered), "")


def kind_of(code: str) -> str:
    """The class of one EC2 error code (module docstring)."""
    if not code:
        return UNKNOWN
    if code in TRANSIENT_CODES:
        return TRANSIENT
    if code in FINAL_CODES or code.startswith(FINAL_PREFIXES):
        return FINAL
    return UNKNOWN


def classify(status_message: str) -> LaunchError:
    """Classify a launch error from its ``StatusMessage``."""
    code = error_code(status_message)
    return LaunchError(kind_of(code), code, status_message or "")


def retry_seconds_left(error: LaunchError, *, failing_since: float | None, now: float,
                       window: float) -> float:
    """How much longer the group's own retries are left to fix ``error`` (0: act now).

    ``failing_since``: when the group started trying (its creation time; None when unknown,
    which acts at once, as before this rule existed). A final error is never waited for."""
    if not error.retryable or failing_since is None or window <= 0:
        return 0.0
    return max(0.0, failing_since + window - now)
