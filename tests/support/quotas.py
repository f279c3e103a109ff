"""The operator's vCPU quota increases for a test's account (``emulator.vcpu_quotas`` refuses
launches above a new account's quotas, as EC2 does: 0 vCPUs of G and P, 5 of Standard)."""

from __future__ import annotations

from emulator import service_quotas
from tests.conftest import REGION


def operator_quotas(endpoint_url: str | None = None) -> list[str]:
    """Raise every EC2 vCPU quota to ``service_quotas.OPERATOR_VCPUS`` in the account at
    ``endpoint_url`` (None: in-process moto, ``mock_aws``, whose Service Quotas this first
    patches as the emulator's server does). Returns the codes raised."""
    import boto3

    service_quotas.install()
    kwargs = {"endpoint_url": endpoint_url} if endpoint_url else {}
    return service_quotas.request_operator_increases(
        boto3.client("service-quotas", region_name=REGION, **kwargs))
