"""Who am I? The node's identity from the instance metadata service (IMDSv2 only).

We go through botocore's metadata fetcher rather than hand-rolled HTTP so that the same
code honours ``AWS_EC2_METADATA_SERVICE_ENDPOINT`` (how the local emulator gives each
emulated node its own fake metadata endpoint) and gets botocore's retry handling.
The identity never comes from an instance-type table or from the hostname.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

METADATA_PATHS = {
    "instance_id": "latest/meta-data/instance-id",
    "instance_type": "latest/meta-data/instance-type",
    "address": "latest/meta-data/local-ipv4",
    "region": "latest/meta-data/placement/region",
    "availability_zone": "latest/meta-data/placement/availability-zone",
}


class IdentityError(RuntimeError):
    """The metadata service could not tell us who we are (names the field and endpoint)."""


@dataclass(frozen=True)
class NodeIdentity:
    instance_id: str
    instance_type: str
    address: str
    region: str
    availability_zone: str = ""


def metadata_endpoint() -> str:
    """The endpoint botocore would use: ``AWS_EC2_METADATA_SERVICE_ENDPOINT`` or the default."""
    import botocore.session
    from botocore.utils import METADATA_BASE_URL

    configured = botocore.session.Session().get_config_variable("ec2_metadata_service_endpoint")
    return configured or METADATA_BASE_URL


def fetch_identity(
    endpoint: str | None = None, *, timeout: float = 2.0, attempts: int = 5, deadline: float = 60.0
) -> NodeIdentity:
    """Read the identity with an IMDSv2 token, retrying for up to ``deadline`` seconds.

    Early in boot the metadata service can briefly refuse connections; we retry rather
    than fail the node. IMDSv1 is never used (the launch templates require tokens).
    """
    from botocore.utils import IMDSFetcher

    endpoint = endpoint or metadata_endpoint()
    fetcher = IMDSFetcher(
        timeout=timeout,
        num_attempts=attempts,
        config={"ec2_metadata_service_endpoint": endpoint, "ec2_metadata_v1_disabled": True},
    )
    give_up = time.monotonic() + deadline
    delay = 0.2
    last_error: Exception | None = None
    while True:
        try:
            return _fetch_once(fetcher, endpoint)
        except Exception as exc:  # retries exhausted, connection refused, ...
            last_error = exc
        if time.monotonic() >= give_up:
            raise IdentityError(
                f"instance metadata at {endpoint} did not answer within {deadline:.0f}s: "
                f"{last_error!r}"
            ) from last_error
        time.sleep(delay)
        delay = min(delay * 2, 5.0)


def _fetch_once(fetcher, endpoint: str) -> NodeIdentity:
    token = fetcher._fetch_metadata_token()
    if not token:
        raise IdentityError(f"no IMDSv2 token from {endpoint} (PUT latest/api/token)")
    values: dict[str, str] = {}
    for field_name, path in METADATA_PATHS.items():
        response = fetcher._get_request(path, None, token)
        values[field_name] = response.text.strip()
    if not values["region"] and values["availability_zone"]:
        values["region"] = values["availability_zone"][:-1]
    for required in ("instance_id", "address"):
        if not values[required]:
            raise IdentityError(f"metadata {METADATA_PATHS[required]} is empty at {endpoint}")
    return NodeIdentity(**values)
