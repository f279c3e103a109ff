"""Who am I? The node's identity from the instance metadata service (IMDSv2 only).

The endpoint is the one botocore's configuration names, so ``AWS_EC2_METADATA_SERVICE_ENDPOINT``
(how the local emulator gives each emulated node its own fake metadata endpoint) and the
AWS config file are honoured. The requests themselves are the two of IMDSv2: ``PUT
latest/api/token`` for a session token, then ``GET`` with that token; IMDSv1 is never used
(the launch templates require tokens). The identity never comes from an instance-type table
or from the hostname.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from dataclasses import dataclass

METADATA_PATHS = {
    "instance_id": "latest/meta-data/instance-id",
    "instance_type": "latest/meta-data/instance-type",
    "address": "latest/meta-data/local-ipv4",
    "region": "latest/meta-data/placement/region",
    "availability_zone": "latest/meta-data/placement/availability-zone",
}


TOKEN_PATH = "latest/api/token"
TOKEN_TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
#: Seconds a session token lives (botocore asks for the same).
TOKEN_TTL_SECONDS = 21600


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
    than fail the node. Each request is tried ``attempts`` times with ``timeout`` seconds.
    """
    endpoint = endpoint or metadata_endpoint()
    give_up = time.monotonic() + deadline
    delay = 0.2
    last_error: Exception | None = None
    while True:
        try:
            return _fetch_once(endpoint, timeout=timeout, attempts=attempts)
        except Exception as exc:  # retries exhausted, connection refused, ...
            last_error = exc
        if time.monotonic() >= give_up:
            raise IdentityError(
                f"instance metadata at {endpoint} did not answer within {deadline:.0f}s: "
                f"{last_error!r}"
            ) from last_error
        time.sleep(delay)
        delay = min(delay * 2, 5.0)


def _request(url: str, *, method: str, headers: dict[str, str], timeout: float,
             attempts: int) -> str:
    """One metadata request, tried ``attempts`` times over connection errors and 5xx."""
    last: Exception | None = None
    for _ in range(max(1, attempts)):
        req = urllib.request.Request(url, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.read().decode("utf-8", errors="replace")
        except urllib.error.HTTPError as exc:
            if exc.code < 500:
                raise
            last = exc
        except (urllib.error.URLError, OSError) as exc:
            last = exc
    assert last is not None
    raise last


def _fetch_once(endpoint: str, *, timeout: float, attempts: int) -> NodeIdentity:
    base = endpoint if endpoint.endswith("/") else endpoint + "/"
    token = _request(base + TOKEN_PATH, method="PUT", timeout=timeout, attempts=attempts,
                     headers={TOKEN_TTL_HEADER: str(TOKEN_TTL_SECONDS)}).strip()
    if not token:
        raise IdentityError(f"no IMDSv2 token from {endpoint} (PUT {TOKEN_PATH})")
    values: dict[str, str] = {}
    for field_name, path in METADATA_PATHS.items():
        values[field_name] = _request(base + path, method="GET", timeout=timeout,
                                      attempts=attempts, headers={TOKEN_HEADER: token}).strip()
    if not values["region"] and values["availability_zone"]:
        values["region"] = values["availability_zone"][:-1]
    for required in ("instance_id", "address"):
        if not values[required]:
            raise IdentityError(f"metadata {METADATA_PATHS[required]} is empty at {endpoint}")
    return NodeIdentity(**values)


def read_metadata(path: str, endpoint: str | None = None, *, timeout: float = 2.0,
                  attempts: int = 3) -> str | None:
    """One metadata item (``latest/meta-data/...``) with a fresh IMDSv2 token; None when the
    service answers 404 (an item EC2 does not serve to this instance, such as
    ``autoscaling/target-lifecycle-state`` outside an Auto Scaling group). Other failures
    raise (OSError, urllib's errors) for the caller to retry."""
    endpoint = endpoint or metadata_endpoint()
    base = endpoint if endpoint.endswith("/") else endpoint + "/"
    token = _request(base + TOKEN_PATH, method="PUT", timeout=timeout, attempts=attempts,
                     headers={TOKEN_TTL_HEADER: str(TOKEN_TTL_SECONDS)}).strip()
    try:
        return _request(base + path, method="GET", timeout=timeout, attempts=attempts,
                        headers={TOKEN_HEADER: token}).strip()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise
