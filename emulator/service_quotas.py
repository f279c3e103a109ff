"""Service Quotas for EC2's vCPU quotas, as a new AWS account has them.

moto's Service Quotas knows only VPC quotas: for any EC2 quota it answers
``NoSuchResourceException``, so a quota check against the emulator could never refuse. AWS
counts running On-Demand and Spot instances in vCPUs per instance class, each class one
quota (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-on-demand-instances.html#ec2-on-demand-instances-limits),
and a new account starts with the GPU and accelerator classes at 0 vCPUs: a first GPU
cluster needs a quota increase
(https://docs.aws.amazon.com/servicequotas/latest/userguide/request-quota-increase.html).
Here, in the emulator's moto server:

- ``ListAWSDefaultServiceQuotas`` / ``GetAWSDefaultServiceQuota`` for ``ec2`` answer
  :data:`EC2_DEFAULTS` (the values a new account's Service Quotas console shows: 5 vCPUs of
  Standard instances, 0 of G and VT, P, Inf and Trn, On-Demand and Spot);
- ``GetServiceQuota`` answers the account's applied value: the default, or what an increase
  set;
- ``RequestServiceQuotaIncrease`` raises the applied value. AWS reviews a request and may take
  hours or days (status ``PENDING`` / ``CASE_OPENED``); the emulator approves it at once
  (``APPROVED``): the harness plays an operator whose increase went through
  (docs/emulator.md).

Quota codes not listed stay moto's ``NoSuchResourceException``. ``emulator.vcpu_quotas``
refuses launches above the applied values (:func:`applied_value`, per instance family
:data:`FAMILY_QUOTAS`); :func:`request_operator_increases` is the operator's increase the demo
and the test clusters request first.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

SERVICE_NAME = "Amazon Elastic Compute Cloud (Amazon EC2)"

#: quota code -> (name, a new account's value in vCPUs).
EC2_DEFAULTS: dict[str, tuple[str, float]] = {
    "L-1216C47A": ("Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances", 5.0),
    "L-DB2E81BA": ("Running On-Demand G and VT instances", 0.0),
    "L-417A185B": ("Running On-Demand P instances", 0.0),
    "L-1945791B": ("Running On-Demand Inf instances", 0.0),
    "L-2C3B7624": ("Running On-Demand Trn instances", 0.0),
    "L-34B43A08": ("All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests", 5.0),
    "L-3819A6DF": ("All G and VT Spot Instance Requests", 0.0),
    "L-7212CCBC": ("All P Spot Instance Requests", 0.0),
}

#: Instance family (the letters before the generation digit) -> (On-Demand quota code, Spot
#: quota code or None): the instance class whose quota an instance counts against
#: (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-on-demand-instances.html#ec2-on-demand-instances-limits).
#: Families not listed (DL, F, X, high memory ``u-``) have no quota here: not enforced.
_STANDARD = ("L-1216C47A", "L-34B43A08")
FAMILY_QUOTAS: dict[str, tuple[str, str | None]] = {
    **{family: _STANDARD for family in ("a", "c", "d", "h", "i", "m", "r", "t", "z")},
    "g": ("L-DB2E81BA", "L-3819A6DF"), "vt": ("L-DB2E81BA", "L-3819A6DF"),
    "p": ("L-417A185B", "L-7212CCBC"), "inf": ("L-1945791B", None), "trn": ("L-2C3B7624", None),
}

#: vCPUs of every EC2 quota above that the emulated account's operator had approved before
#: the demo and the test clusters launch (:func:`request_operator_increases`): a new
#: account's 0 vCPUs of G and P would refuse their nodes, on AWS as here.
OPERATOR_VCPUS = 1024.0

_INSTALLED = False


def quota_code(instance_type: str, *, spot: bool) -> str | None:
    """The EC2 vCPU quota ``instance_type`` counts against (On-Demand, or Spot), None when
    this module has no quota for its family."""
    match = re.match(r"^([a-z]+)[0-9]", instance_type)
    codes = FAMILY_QUOTAS.get(match.group(1)) if match else None
    return (codes[1] if spot else codes[0]) if codes else None


def applied_value(account: str, region: str, code: str) -> float:
    """What GetServiceQuota answers for ``code`` in that account and region: the default, or
    the value an approved increase set."""
    from moto.servicequotas.models import servicequotas_backends

    return _applied(servicequotas_backends[account][region]).get(code, EC2_DEFAULTS[code][1])


def _quota(region: str, account: str | None, code: str, value: float) -> dict[str, Any]:
    """A ``ServiceQuota`` structure (an account's when ``account``, else AWS's default)."""
    return {"ServiceCode": "ec2", "ServiceName": SERVICE_NAME,
            "QuotaArn": f"arn:aws:servicequotas:{region}:{account or ''}:ec2/{code}",
            "QuotaCode": code, "QuotaName": EC2_DEFAULTS[code][0], "Value": value,
            "Unit": "None", "Adjustable": True, "GlobalQuota": False}


def _applied(backend: Any) -> dict[str, float]:
    """The account's applied EC2 values (a backend is per account and region; moto's reset
    replaces it, so a reset account is a new account again)."""
    if not hasattr(backend, "_dl_applied"):
        backend._dl_applied = {}
    return backend._dl_applied


def _no_such(code: str) -> Exception:
    from moto.servicequotas.exceptions import NoSuchResource

    del code
    return NoSuchResource()


def install() -> None:
    """Patch moto's Service Quotas backend and responses (idempotent)."""
    global _INSTALLED
    if _INSTALLED:
        return
    from moto.servicequotas.models import ServiceQuotasBackend
    from moto.servicequotas.responses import ServiceQuotasResponse

    list_defaults = ServiceQuotasBackend.list_aws_default_service_quotas
    get_quota = ServiceQuotasBackend.get_service_quota

    def list_aws_default_service_quotas(self: Any, service_code: str) -> list[dict]:
        if service_code == "ec2":
            return [_quota(self.region_name, None, code, value)
                    for code, (_name, value) in EC2_DEFAULTS.items()]
        return list_defaults(self, service_code)

    def get_service_quota(self: Any, service_code: str, quota_code: str) -> dict:
        if service_code == "ec2":
            if quota_code not in EC2_DEFAULTS:
                raise _no_such(quota_code)
            value = _applied(self).get(quota_code, EC2_DEFAULTS[quota_code][1])
            return _quota(self.region_name, self.account_id, quota_code, value)
        return get_quota(self, service_code, quota_code)

    def get_aws_default(self: Any) -> str:
        params = json.loads(self.body)
        code, service = str(params.get("QuotaCode")), str(params.get("ServiceCode"))
        if service != "ec2" or code not in EC2_DEFAULTS:
            raise _no_such(code)
        return json.dumps({"Quota": _quota(self.region, None, code, EC2_DEFAULTS[code][1])})

    def request_increase(self: Any) -> str:
        params = json.loads(self.body)
        code, service = str(params.get("QuotaCode")), str(params.get("ServiceCode"))
        desired = float(params.get("DesiredValue"))
        if service != "ec2" or code not in EC2_DEFAULTS:
            raise _no_such(code)
        _applied(self.backend)[code] = desired
        return json.dumps({"RequestedQuota": {
            "Id": uuid.uuid4().hex, "ServiceCode": "ec2", "ServiceName": SERVICE_NAME,
            "QuotaCode": code, "QuotaName": EC2_DEFAULTS[code][0], "DesiredValue": desired,
            "Status": "APPROVED", "Unit": "None", "GlobalQuota": False,
            "QuotaArn": f"arn:aws:servicequotas:{self.region}:{self.current_account}:ec2/{code}"}})

    ServiceQuotasBackend.list_aws_default_service_quotas = list_aws_default_service_quotas  # type: ignore[method-assign]
    ServiceQuotasBackend.get_service_quota = get_service_quota  # type: ignore[method-assign]
    ServiceQuotasResponse.get_aws_default_service_quota = get_aws_default  # type: ignore[attr-defined]
    ServiceQuotasResponse.request_service_quota_increase = request_increase  # type: ignore[attr-defined]
    _INSTALLED = True


def request_operator_increases(client: Any, vcpus: float = OPERATOR_VCPUS) -> list[str]:
    """What an operator does before a first GPU cluster (README, ``dlc up``'s preflight names
    the quota): RequestServiceQuotaIncrease to ``vcpus`` for every EC2 quota above whose
    applied value is lower, through the public API (``client``: a Service Quotas client of
    the emulator). Returns the codes raised. The demo and ``emulator.resources`` call it
    before their groups launch; the tests of a new account's quotas do not."""
    raised = []
    for code in EC2_DEFAULTS:
        value = client.get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"]
        if value < vcpus:
            client.request_service_quota_increase(ServiceCode="ec2", QuotaCode=code,
                                                  DesiredValue=vcpus)
            raised.append(code)
    return raised
