"""Signal a CloudFormation wait-condition handle (what ``cfn-signal`` does, without it).

The handle is a presigned S3 URL; CloudFormation reads the JSON body we PUT there. The
presigned signature covers the Content-Type, which is empty, so we must send an empty
Content-Type header (urllib would otherwise add a form-encoded one and S3 would answer 403).
An empty handle means "nothing to signal" (the local emulator's CloudFormation resolves
the handle to ''), which is logged and is not an error.
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
    if not handle_url:
        logger.info("event=wait-condition status=%s nothing to signal (empty handle) reason=%r",
                    status, reason)
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
