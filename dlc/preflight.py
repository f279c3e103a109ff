"""``dlc up``'s checks against the account, before anything is deployed.

A deploy that asks for an instance type the region does not offer, a key pair that does not
exist, a DLAMI parameter that is not published or more GPU vCPUs than the account's quota
fails 10 to 55 minutes later with a rollback. These are read-only calls, so ``dlc up`` makes them
first and refuses with every problem at once, each naming the context key, the value and the
limit:

- the instance types: EC2 DescribeInstanceTypeOfferings in the region;
- ``keyName``: EC2 DescribeKeyPairs; ``amiId``: EC2 DescribeImages;
- the default image: SSM GetParameter on the DLAMI's public parameter (``imageType`` and
  ``pytorchVersion`` name it);
- with ``efa``: each instance type supports EFA and has the EFA network cards the stack gives
  interfaces (EC2 DescribeInstanceTypes);
- the vCPUs the nodes need against the EC2 quota of their instance class (Service Quotas
  GetServiceQuota, else GetAWSDefaultServiceQuota). A quota Service Quotas cannot report
  (no permission, or an instance class this module does not know) is skipped with a line
  that says so: a quota the operator cannot read is not a reason to refuse a deploy.

The settings themselves are parsed with the stack's own description (``stacks.settings``),
so a bad value is refused here with the same message ``cdk synth`` would print.
"""

from __future__ import annotations

from collections.abc import Callable

from dlc import aws
from dlc.errors import AwsError, DlcError, UsageError
from dlc.target import Target
from lambda_src import quota_classes  # the product's one table and sum of EC2 quotas
from lambda_src.quota_classes import Need, Nodes, quota_class

__all__ = ["Need", "check", "quota_class", "vcpu_needs"]

Echo = Callable[[str], None]


def vcpu_needs(settings, vcpus: dict[str, int]) -> tuple[list[Need], list[str]]:
    """The vCPUs per quota for the nodes as first launched (the preferred types): the master,
    ``workerCount`` On-Demand workers, ``spotWorkers`` Spot workers
    (``lambda_src.quota_classes.vcpu_needs``, the stack's own check's sum too). Returns the
    needs and the types whose quota is not known here."""
    master = (settings.master_instance_types or (settings.master_instance_type or _default(),))
    worker = (settings.worker_instance_types or (settings.worker_instance_type or _default(),))
    return quota_classes.vcpu_needs([
        Nodes("masterInstanceType", master[0], 1),
        Nodes("workerInstanceType", worker[0], settings.worker_count),
        Nodes("workerInstanceType", worker[0], settings.spot_workers, spot=True)], vcpus)


def _default() -> str:
    from constructs_lib.cluster_settings import DEFAULT_INSTANCE_TYPE

    return DEFAULT_INSTANCE_TYPE


def parse_settings(contexts: list[str]):
    """ClusterSettings from ``-c key=value`` pairs, checked as ``cdk synth`` checks them."""
    from constructs_lib.validation import ConfigError
    from stacks.context import refuse_unknown_keys
    from stacks.emr_stack import EMR_CONTEXT_KEYS
    from stacks.settings import CONTEXT_KEYS, settings_from_context

    values = dict(pair.split("=", 1) for pair in contexts)
    try:
        refuse_unknown_keys(values, {*CONTEXT_KEYS, *EMR_CONTEXT_KEYS})
        return settings_from_context(values.get)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def _refused(what: str, fn: Callable, codes: tuple[str, ...], **kwargs) -> tuple[dict, str]:
    """``(fn(**kwargs), "")``, or ``({}, code)`` when AWS answers with an error code starting
    with one of ``codes``; any other AWS failure is an AwsError naming the call."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return fn(**kwargs), ""
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if any(code.startswith(c) for c in codes):
            return {}, code
        raise aws.aws_error(exc, what) from None
    except BotoCoreError as exc:
        raise AwsError(f"{what} failed: {exc}") from None


def check(target: Target, contexts: list[str], echo: Echo) -> None:
    """Every check of the module docstring; DlcError listing each refusal."""
    s = parse_settings(contexts)
    region = target.region
    ec2 = target.client("ec2")
    problems: list[str] = []
    types: dict[str, tuple[str, ...]] = {
        "masterInstanceTypes" if s.master_instance_types else "masterInstanceType":
            s.master_instance_types or (s.master_instance_type or _default(),),
        "workerInstanceTypes" if s.worker_instance_types else "workerInstanceType":
            s.worker_instance_types or (s.worker_instance_type or _default(),),
    }
    every = sorted({t for ts in types.values() for t in ts})
    offered = {o["InstanceType"] for page in aws.call(
        "ec2 DescribeInstanceTypeOfferings",
        lambda: list(ec2.get_paginator("describe_instance_type_offerings").paginate(
            LocationType="region", Filters=[{"Name": "instance-type", "Values": every}])))
        for o in page["InstanceTypeOfferings"]}
    for key, names in types.items():
        for name in names:
            if name not in offered:
                problems.append(f"context key '{key}': {name} is not offered in {region} "
                                f"(EC2 DescribeInstanceTypeOfferings)")
    if s.key_name and _refused("ec2 DescribeKeyPairs", ec2.describe_key_pairs,
                               ("InvalidKeyPair.NotFound",), KeyNames=[s.key_name])[1]:
        problems.append(f"context key 'keyName': key pair {s.key_name!r} does not exist "
                            f"in {region} (EC2 DescribeKeyPairs)")
    if s.ami_id:
        found, _ = _refused("ec2 DescribeImages", ec2.describe_images, ("InvalidAMIID",),
                            ImageIds=[s.ami_id])
        if not found.get("Images"):
            problems.append(f"context key 'amiId': image {s.ami_id} does not exist in "
                            f"{region} (EC2 DescribeImages)")
    else:
        problems += _check_dlami(target, s)
    if offered:
        described = aws.call("ec2 DescribeInstanceTypes", ec2.describe_instance_types,
                             InstanceTypes=[t for t in every if t in offered])["InstanceTypes"]
        problems += _check_efa(s, types, described)
        problems += _check_quotas(target, s, described, echo)
    if problems:
        raise DlcError("dlc up: the account cannot deploy these settings, nothing was "
                       "deployed:\n  " + "\n  ".join(problems))
    echo(f"checked against {region}: instance types offered"
         + (", key pair exists" if s.key_name else "")
         + (", image exists" if s.ami_id else ", DLAMI parameter published")
         + ", vCPU quotas")


def _check_dlami(target: Target, s) -> list[str]:
    from constructs_lib.images import dlami_parameter

    parameter = dlami_parameter(s.image_type, s.pytorch_version)
    if _refused("ssm GetParameter", target.client("ssm").get_parameter,
                ("ParameterNotFound",), Name=parameter)[1]:
        return [f"context keys 'imageType'={s.image_type!r} / 'pytorchVersion'="
                f"{s.pytorch_version or 'default'!r}: the DLAMI parameter {parameter} is not "
                f"published in {target.region} (SSM GetParameter); pick a PyTorch line its "
                f"release notes list, or give amiId"]
    return []


def _check_efa(s, types: dict[str, tuple[str, ...]], described: list[dict]) -> list[str]:
    """With ``efa``: every type supports EFA, and its EFA network cards are the ones the
    stack gives interfaces (``constructs_lib.efa``, a table kept at synth time: a type AWS
    changed or added since is caught here, before the launches fail)."""
    if not s.efa:
        return []
    from constructs_lib.efa import efa_cards

    problems = []
    by_name = {d["InstanceType"]: d.get("NetworkInfo", {}) for d in described}
    for key, names in types.items():
        for name in names:
            net = by_name.get(name)
            if net is None:
                continue  # not offered: reported already
            if not net.get("EfaSupported"):
                problems.append(f"context keys 'efa'=true / '{key}': {name} does not support "
                                f"EFA (EC2 DescribeInstanceTypes NetworkInfo.EfaSupported)")
                continue
            cards = sorted(c["NetworkCardIndex"] for c in net.get("NetworkCards", [])
                           if "efa" in c.get("InterfaceTypes", ["efa"]))
            cards = cards[:net.get("EfaInfo", {}).get("MaximumEfaInterfaces", 1)]
            if tuple(cards) != efa_cards(name):
                problems.append(
                    f"context keys 'efa'=true / '{key}': the stack gives {name} "
                    f"{len(efa_cards(name))} EFA interface(s), EC2 DescribeInstanceTypes "
                    f"says its EFA network cards are {cards}; update EFA_CARDS in "
                    f"constructs_lib/efa.py")
    return problems


def _check_quotas(target: Target, s, described: list[dict], echo: Echo) -> list[str]:
    vcpus = {t["InstanceType"]: int(t["VCpuInfo"]["DefaultVCpus"]) for t in described}
    needs, unknown = vcpu_needs(s, vcpus)
    for itype in unknown:
        echo(f"quota check skipped for {itype}: its vCPU quota is not known to dlc")
    if s.capacity_block_id:
        echo("quota check skipped: a Capacity Block's instances do not use the On-Demand "
             "quotas")
        return []
    quotas = target.client("service-quotas")
    problems = []
    for need in needs:
        value = _quota(quotas, need.code)
        if value is None:
            echo(f"quota check skipped for {need.name} ({need.code}): Service Quotas does "
                 f"not report it here")
        elif quota_classes.shortfall(need, value, target.region):
            problems.append(quota_classes.shortfall(need, value, target.region))
    return problems


def _quota(client, code: str) -> float | None:
    """The applied quota (GetServiceQuota), else AWS's default (ListAWSDefaultServiceQuotas:
    GetServiceQuota reports only quotas with an applied value); None when Service Quotas
    cannot say."""
    answer, _ = _refused("service-quotas GetServiceQuota", client.get_service_quota,
                         ("NoSuchResource", "AccessDenied"), ServiceCode="ec2", QuotaCode=code)
    if answer:
        return float(answer["Quota"]["Value"])
    pages, _ = _refused(
        "service-quotas ListAWSDefaultServiceQuotas",
        lambda **kw: list(client.get_paginator("list_aws_default_service_quotas").paginate(**kw)),
        ("NoSuchResource", "AccessDenied"), ServiceCode="ec2")
    for page in pages or []:
        for quota in page.get("Quotas", []):
            if quota.get("QuotaCode") == code:
                return float(quota["Value"])
    return None
