"""Cost Explorer's cost allocation tags for the emulator's moto server: ListCostAllocationTags
and UpdateCostAllocationTagsStatus, which moto's Cost Explorer lacks.

On AWS a user-defined tag key counts in Cost Explorer and Budgets only once it is activated
in Billing; a key shows up in the list (``Inactive``) only after it has been used on a
resource, up to 24 hours later
(https://docs.aws.amazon.com/awsaccountbilling/latest/aboutv2/activating-tags.html,
https://docs.aws.amazon.com/aws-cost-management/latest/APIReference/API_ListCostAllocationTags.html).
Here a key is listed as soon as an instance of the account carries it (the emulator does not
make ``dlc status`` wait a day), ``Inactive`` as on a new account, and
UpdateCostAllocationTagsStatus activates it; a key never used cannot be activated, as AWS
answers (in ``Errors``, not as a failure of the call).
"""

from __future__ import annotations

import json
from typing import Any

_INSTALLED = False


def _statuses(backend: Any) -> dict[str, str]:
    """key -> Active / Inactive, as set through UpdateCostAllocationTagsStatus."""
    if not hasattr(backend, "_dl_tag_statuses"):
        backend._dl_tag_statuses = {}
    return backend._dl_tag_statuses


def used_keys(account: str) -> set[str]:
    """The tag keys on the account's instances, in every region (what Billing has seen)."""
    from moto.ec2.models import ec2_backends

    keys: set[str] = set()
    for backend in ec2_backends[account].values():
        for reservation in getattr(backend, "reservations", {}).values():
            for instance in reservation.instances:
                keys.update(t["key"] for t in backend.describe_tags(
                    filters={"resource-id": [instance.id]}))
    return {k for k in keys if not k.startswith("aws:")}


def _list(self: Any) -> str:
    params = json.loads(self.body or "{}")
    wanted = params.get("TagKeys") or []
    kind = params.get("Type")
    statuses = _statuses(self.ce_backend)
    tags = [{"TagKey": k, "Type": "UserDefined", "Status": statuses.get(k, "Inactive")}
            for k in sorted(used_keys(self.current_account))
            if (not wanted or k in wanted) and kind in (None, "UserDefined")
            and params.get("Status") in (None, statuses.get(k, "Inactive"))]
    return json.dumps({"CostAllocationTags": tags})


def _update(self: Any) -> str:
    params = json.loads(self.body or "{}")
    used = used_keys(self.current_account)
    statuses = _statuses(self.ce_backend)
    errors = []
    for entry in params.get("CostAllocationTagsStatus", []):
        key, status = entry.get("TagKey"), entry.get("Status")
        if key not in used:
            errors.append({"TagKey": key, "Code": "TagKeysNotFoundException",
                           "Message": f"Failed to update, tag key {key} not found"})
        else:
            statuses[key] = status
    return json.dumps({"Errors": errors})


def install() -> None:
    """Add both actions to moto's Cost Explorer responses in this process (idempotent)."""
    global _INSTALLED
    if _INSTALLED:
        return
    from moto.ce.responses import CostExplorerResponse

    CostExplorerResponse.list_cost_allocation_tags = _list  # type: ignore[attr-defined]
    CostExplorerResponse.update_cost_allocation_tags_status = _update  # type: ignore[attr-defined]
    _INSTALLED = True
