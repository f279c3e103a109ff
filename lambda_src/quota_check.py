"""The stack's own vCPU quota check, before the groups launch: a custom resource's Create.

Why: a fresh account's G and P vCPU quotas are 0, and a deploy through plain ``cdk deploy``
(the README's path, not only ``dlc up``, whose preflight checks them) would launch groups
that EC2 refuses with ``VcpuLimitExceeded``, and the stack would fail tens of minutes later
in its setup wait. ``Custom::QuotaCheck`` (the stack's ``QuotaCheck`` construct) is created
before both groups; its Create reads each instance type's vCPUs (EC2
DescribeInstanceTypes), adds up the nodes' vCPUs per quota with ``quota_classes.vcpu_needs``
(the sum ``dlc up`` uses; Spot workers against their class's Spot quota), reads each quota
(Service Quotas GetServiceQuota, else ListAWSDefaultServiceQuotas: a quota never raised has
no applied value) and answers FAILED naming every quota short (its name and code, its value,
the need, the request command): the deploy fails in seconds. A quota Service Quotas cannot
report, or a type whose quota is not known here, is not a reason to refuse (the launch
itself still is), and is said in the answer's reason. Update checks again; Delete does
nothing.

Properties: ``Nodes``, a list of ``{"Key", "InstanceType", "Count", "Spot"}``.
Permissions (granted to the capacity adjuster's role, which answers):
``ec2:DescribeInstanceTypes``, ``servicequotas:GetServiceQuota``,
``servicequotas:ListAWSDefaultServiceQuotas`` (none takes a resource).
"""

from __future__ import annotations

from typing import Any

try:  # imported as lambda_src.quota_check (tests, installed package)
    from . import cfn_response, quota_classes
except ImportError:  # imported as quota_check (Lambda: the asset root is on sys.path)
    import cfn_response  # type: ignore[no-redef]
    import quota_classes  # type: ignore[no-redef]

RESOURCE_TYPE = "Custom::QuotaCheck"


def nodes(event: dict[str, Any]) -> list[quota_classes.Nodes]:
    """The request's ``Nodes`` (ValueError naming what is wrong)."""
    raw = (event.get("ResourceProperties") or {}).get("Nodes")
    if not isinstance(raw, list) or not raw:
        raise ValueError(f"ResourceProperties.Nodes must be a non-empty list, got {raw!r}")
    out = []
    for item in raw:
        try:  # CloudFormation passes every scalar as a string
            out.append(quota_classes.Nodes(str(item["Key"]), str(item["InstanceType"]),
                                           int(item["Count"]),
                                           str(item.get("Spot", "false")).lower() == "true"))
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"a node entry needs Key, InstanceType, Count: {item!r}") \
                from None
    return out


def quota_value(quotas: Any, code: str) -> float | None:
    """The applied quota, else AWS's default; None when Service Quotas cannot say (no such
    quota, or access denied: an organization's policy may deny it)."""
    from botocore.exceptions import ClientError

    def unreadable(exc: ClientError) -> bool:  # as dlc up: not a reason to refuse
        code = exc.response.get("Error", {}).get("Code", "")
        return code.startswith(("NoSuchResource", "AccessDenied"))

    try:
        return float(quotas.get_service_quota(ServiceCode="ec2", QuotaCode=code)
                     ["Quota"]["Value"])
    except ClientError as exc:
        if not unreadable(exc):
            raise
    try:
        for page in quotas.get_paginator("list_aws_default_service_quotas").paginate(
                ServiceCode="ec2"):
            for quota in page.get("Quotas", []):
                if quota.get("QuotaCode") == code:
                    return float(quota["Value"])
    except ClientError as exc:
        if not unreadable(exc):
            raise
    return None


def check(wanted: list[quota_classes.Nodes], ec2: Any, quotas: Any,
          region: str) -> tuple[list[str], list[str]]:
    """(every quota short, what was not checked)."""
    types = sorted({n.instance_type for n in wanted})
    described = ec2.describe_instance_types(InstanceTypes=types)["InstanceTypes"]
    vcpus = {t["InstanceType"]: int(t["VCpuInfo"]["DefaultVCpus"]) for t in described}
    needs, unknown = quota_classes.vcpu_needs(wanted, vcpus)
    skipped = [f"{t}: its vCPU quota is not known" for t in unknown]
    short = []
    for need in needs:
        value = quota_value(quotas, need.code)
        if value is None:
            skipped.append(f"{need.name} ({need.code}): not reported by Service Quotas")
        elif quota_classes.shortfall(need, value, region):
            short.append(quota_classes.shortfall(need, value, region))
    return short, skipped


def respond(event: dict[str, Any], ec2: Any, quotas: Any) -> dict[str, Any]:
    """The response object for one request; never raises."""
    kind = event.get("RequestType")
    stack = str(event.get("StackId", "")).split(":")
    region = stack[3] if len(stack) > 3 and stack[3] else getattr(
        getattr(ec2, "meta", None), "region_name", "") or "the cluster's region"
    if kind == "Delete":
        return cfn_response.body(event)
    try:
        short, skipped = check(nodes(event), ec2, quotas, region)
    except Exception as exc:
        return cfn_response.body(event, "FAILED",
                                 f"{RESOURCE_TYPE}: {type(exc).__name__}: {exc}")
    note = f" (not checked: {'; '.join(skipped)})" if skipped else ""
    if short:
        return cfn_response.body(event, "FAILED",
                                 "the account's vCPU quotas cannot launch the nodes: "
                                 + " | ".join(short) + note)
    return cfn_response.body(event, reason=f"vCPU quotas fit the nodes{note}")
