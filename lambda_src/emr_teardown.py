"""The EMR stack's custom-resource function (``emr_teardown.handler``): answers
``Custom::EmrSecurityGroupRelease`` (``emr_security_groups``) through the same dispatch as
the cluster stack's capacity adjuster (``custom_resources``), then PUTs the answer to the
request's ``ResponseURL``. It makes EC2 calls only; every other client is never used."""

from __future__ import annotations

from typing import Any

try:  # imported as lambda_src.emr_teardown (tests, installed package)
    from . import custom_resources
except ImportError:  # imported as emr_teardown (Lambda: the asset root is on sys.path)
    import custom_resources  # type: ignore[no-redef]


class _Clients:
    """boto3 clients, made on first use (only ``ec2`` is used here)."""

    def __init__(self) -> None:
        import boto3

        self._session = boto3.session.Session()

    @property
    def ec2(self) -> Any:
        return self._session.client("ec2")

    @property
    def autoscaling(self) -> Any:
        return self._session.client("autoscaling")

    @property
    def service_quotas(self) -> Any:
        return self._session.client("service-quotas")

    @property
    def kms(self) -> Any:
        return self._session.client("kms")

    @property
    def efs(self) -> Any:
        return self._session.client("efs")


def handler(event: Any, _context: Any) -> dict[str, Any]:
    """Lambda entry point: CloudFormation's request, answered on its ``ResponseURL``."""
    answer = custom_resources.handle(event, _Clients())
    print({"type": event.get("ResourceType"), "request": event.get("RequestType"),
           "status": answer["Status"], "reason": answer.get("Reason", "")})
    return answer
