"""Signal a CloudFormation wait-condition handle (what ``cfn-signal`` does, without it).

The handle is a presigned S3 URL; CloudFormation reads the JSON body we PUT there. The
presigned signature covers the Content-Type, which is empty, so we must send an empty
Content-Type header (urllib would otherwise add a form-encoded one and S3 would answer 403).
A handle that is not an http(s) URL means "nothing to signal": CloudFormation emulators
resolve the handle to '' or to the text 'None'. That is logged with the value and is not an
error; the cluster still forms.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request

log = logging.getLogger(__name__)

SUCCESS = "SUCCESS"
FAILURE = "FAILURE"
#: CloudFormation truncates longer reasons; keep the useful start.
MAX_REASON = 4000


def signal_body(status: str, reason: str, unique_id: str, data: str = "") -> bytes:
    if status not in (SUCCESS, FAILURE):
        raise ValueError(f"wait-condition status must be SUCCESS or FAILURE, got {status!r}")
    body = {"Status": status, "Reason": reason[:MAX_REASON], "UniqueId": unique_id,
            "Data": data}
    return json.dumps(body).encode()


def is_signal_url(handle_url: str | None) -> bool:
    """Only an http(s) URL can be signalled; anything else (empty, 'None') is no handle."""
    return bool(handle_url) and str(handle_url).lower().startswith(("https://", "http://"))


def signal(
    handle_url: str,
    status: str,
    reason: str,
    unique_id: str,
    data: str = "",
    *,
    attempts: int = 5,
    timeout: float = 10.0,
    logger: logging.Logger = log,
) -> bool:
    """PUT the signal; True when delivered (or nothing to signal). Retries transient errors."""
    body = signal_body(status, reason, unique_id, data)
    if not is_signal_url(handle_url):
        logger.info("event=wait-condition status=%s nothing to signal (handle %r is not a URL) "
                    "reason=%r", status, handle_url, reason)
        return True
    delay = 1.0
    for attempt in range(1, attempts + 1):
        req = urllib.request.Request(handle_url, data=body, method="PUT",
                                     headers={"Content-Type": ""})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                resp.read()
            logger.info("event=wait-condition status=%s delivered attempt=%d reason=%r",
                        status, attempt, reason)
            return True
        except (urllib.error.URLError, OSError) as exc:
            logger.warning("event=wait-condition-retry status=%s attempt=%d error=%r",
                           status, attempt, exc)
        if attempt < attempts:
            time.sleep(delay)
            delay = min(delay * 2, 10.0)
    logger.error("event=wait-condition-failed status=%s could not reach the handle after %d "
                 "attempts", status, attempts)
    return False
