"""CloudFormation's custom-resource protocol, the function's side: the response object and
its PUT to the request's presigned ``ResponseURL`` with an empty Content-Type (the
signature covers the header),
https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/crpg-ref-responses.html."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

#: CloudFormation keeps the start of a long reason; the useful part comes first.
MAX_REASON = 4000


def is_request(event: Any) -> bool:
    """A CloudFormation custom-resource request (not an SNS delivery)."""
    return isinstance(event, dict) and "RequestType" in event and "ResponseURL" in event


def body(event: dict[str, Any], status: str = "SUCCESS", reason: str = "") -> dict[str, Any]:
    """The response object for ``event``: its ids echoed, the physical id kept (or the
    logical id's on Create)."""
    kind = str(event.get("ResourceType", "")).removeprefix("Custom::").lower()
    physical = str(event.get("PhysicalResourceId")
                   or f"{event.get('LogicalResourceId', 'Resource')}-{kind}")
    out: dict[str, Any] = {
        "Status": status, "PhysicalResourceId": physical,
        "StackId": event.get("StackId", ""), "RequestId": event.get("RequestId", ""),
        "LogicalResourceId": event.get("LogicalResourceId", ""), "Data": {}}
    if reason:
        out["Reason"] = reason[:MAX_REASON]
    return out


def send(url: str, response: dict[str, Any]) -> None:
    """PUT the response object to the presigned URL."""
    data = json.dumps(response).encode()
    request = urllib.request.Request(url, data=data, method="PUT", headers={
        "Content-Type": "", "Content-Length": str(len(data))})
    with urllib.request.urlopen(request, timeout=15) as answer:
        answer.read()
