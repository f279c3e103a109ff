"""The stack's custom resources answered by the capacity adjuster's function, by type:
``Custom::ClusterRelease`` (``cluster_release``), ``Custom::QuotaCheck`` (``quota_check``),
``Custom::ServiceRoleGrant`` (``service_role_grant``), ``Custom::EfsAccessCheck``
(``efs_access``) and ``Custom::CapacityBlockEnd`` (``capacity_block``): one function fewer to
deploy, and its role already scoped to the cluster's
groups. The EMR stack's own function (``emr_teardown.handler``) answers
``Custom::EmrSecurityGroupRelease`` (``emr_security_groups``) through the same dispatch."""

from __future__ import annotations

from typing import Any, Protocol

try:  # imported as lambda_src.custom_resources (tests, installed package)
    from . import (
        capacity_block,
        cfn_response,
        cluster_release,
        efs_access,
        emr_security_groups,
        quota_check,
        service_role_grant,
    )
except ImportError:  # imported as custom_resources (Lambda: the asset root is on sys.path)
    import capacity_block  # type: ignore[no-redef]
    import cfn_response  # type: ignore[no-redef]
    import cluster_release  # type: ignore[no-redef]
    import efs_access  # type: ignore[no-redef]
    import emr_security_groups  # type: ignore[no-redef]
    import quota_check  # type: ignore[no-redef]
    import service_role_grant  # type: ignore[no-redef]

is_request = cfn_response.is_request


class Clients(Protocol):
    """The boto3 clients the answers call (made on first use)."""

    @property
    def autoscaling(self) -> Any: ...
    @property
    def ec2(self) -> Any: ...
    @property
    def service_quotas(self) -> Any: ...
    @property
    def kms(self) -> Any: ...
    @property
    def efs(self) -> Any: ...


def respond(event: dict[str, Any], clients: Clients) -> dict[str, Any]:
    """The response object for one request of a type this function answers."""
    kind = event.get("ResourceType")
    try:
        if kind == cluster_release.RESOURCE_TYPE:
            return cluster_release.respond(event, clients.autoscaling)
        if kind == quota_check.RESOURCE_TYPE:
            return quota_check.respond(event, clients.ec2, clients.service_quotas)
        if kind == capacity_block.RESOURCE_TYPE:
            return capacity_block.respond(event, clients.ec2)
        if kind == efs_access.RESOURCE_TYPE:
            return efs_access.respond(event, clients.efs, clients.ec2)
        if kind == emr_security_groups.RESOURCE_TYPE:
            return emr_security_groups.respond(event, clients.ec2)
        if kind == service_role_grant.RESOURCE_TYPE:
            return service_role_grant.respond(event, clients.kms)
    except Exception as exc:  # no client to call with: answered, never raised
        return cfn_response.body(event, "FAILED", f"{kind}: {type(exc).__name__}: {exc}")
    return cfn_response.body(event, "FAILED", f"this function answers no {kind!r}")


def handle(event: dict[str, Any], clients: Clients) -> dict[str, Any]:
    """Answer one request: its calls, then the PUT to ``ResponseURL``."""
    answer = respond(event, clients)
    cfn_response.send(str(event["ResponseURL"]), answer)
    return answer
