"""EMR refuses to launch into untagged network resources when its service role has the v2
managed policy, as AWS does (part of ``emulator.moto_extensions``, which calls
:func:`install`).

AWS: ``AmazonEMRServicePolicy_v2`` lets EMR run instances and create network interfaces only
in subnets and security groups tagged ``for-use-with-amazon-emr-managed-policies=true``
(statement ``CreateInTaggedNetwork``,
https://docs.aws.amazon.com/aws-managed-policy/latest/reference/AmazonEMRServicePolicy_v2.html);
groups EMR did not create must be tagged by hand
(https://docs.aws.amazon.com/emr/latest/ManagementGuide/emr-managed-iam-policies.html).
Without the tag the cluster cannot launch its instances and ends
``TERMINATED_WITH_ERRORS`` (a validation error naming the permission).

moto 5 launches any cluster. Here RunJobFlow (and CloudFormation's ``AWS::EMR::Cluster``,
which calls it) refuses with ``ValidationException`` when the service role has
``AmazonEMRServicePolicy_v2`` attached and the subnet or any security group of the cluster
(managed, service access, additional) lacks the tag. AWS accepts the call and fails the
cluster a few minutes later; the emulator fails the call, with the same reason, so a deploy
fails at once instead of after a wait.

moto's CloudFormation drops an ``AWS::IAM::Role``'s ``ManagedPolicyArns`` (and moto loads no
AWS managed policy unless told to), so the emulator records them on the role
(``managed_policy_arns``) to know which policy the service role has.
"""

from __future__ import annotations

from typing import Any

TAG_KEY = "for-use-with-amazon-emr-managed-policies"
V2_POLICY = "AmazonEMRServicePolicy_v2"
GROUP_ATTRS = ("emr_managed_master_security_group", "emr_managed_slave_security_group",
               "service_access_security_group")
GROUP_LIST_ATTRS = ("additional_master_security_groups", "additional_slave_security_groups")
_INSTALLED = False


def cluster_network(instance_attrs: dict[str, Any]) -> tuple[str, list[str]]:
    """The subnet id and every security group id RunJobFlow names."""
    groups = [str(instance_attrs[a]) for a in GROUP_ATTRS if instance_attrs.get(a)]
    for attr in GROUP_LIST_ATTRS:
        groups += [str(g) for g in instance_attrs.get(attr) or []]
    return str(instance_attrs.get("ec2_subnet_id") or ""), list(dict.fromkeys(groups))


def untagged(resource_ids: list[str], tags_of: Any) -> list[str]:
    """The ids whose tags (``tags_of(id)`` -> dict) lack ``TAG_KEY=true``."""
    return [r for r in resource_ids if (tags_of(r) or {}).get(TAG_KEY) != "true"]


def uses_v2_policy(role: Any) -> bool:
    arns = [*(getattr(role, "managed_policies", {}) or {}),
            *(getattr(role, "managed_policy_arns", []) or [])]
    return any(str(arn).endswith("/" + V2_POLICY) for arn in arns)


def _wrap_cfn_role(original: Any) -> Any:
    def create_from_cloudformation_json(cls: Any, resource_name: str, cloudformation_json: Any,
                                        *args: Any, **kwargs: Any) -> Any:
        role = original.__func__(cls, resource_name, cloudformation_json, *args, **kwargs)
        properties = cloudformation_json.get("Properties") or {}
        role.managed_policy_arns = [str(a) for a in properties.get("ManagedPolicyArns") or []]
        return role

    return classmethod(create_from_cloudformation_json)


def _service_role(account: str, name_or_arn: str) -> Any:
    from moto.iam.models import iam_backends

    name = str(name_or_arn).rsplit("/", 1)[-1]
    for role in iam_backends[account]["aws"].get_roles():
        if role.name == name:
            return role
    return None


def _wrap_run_job_flow(original: Any) -> Any:
    def run_job_flow(self: Any, **kwargs: Any) -> Any:
        role = _service_role(self.account_id, kwargs.get("service_role", ""))
        if role is not None and uses_v2_policy(role):
            subnet, groups = cluster_network(kwargs.get("instance_attrs") or {})

            def tags_of(resource_id: str) -> dict[str, str]:
                return self.ec2_backend.tags.get(resource_id, {})

            missing = untagged([subnet] if subnet else [], tags_of) + untagged(groups, tags_of)
            if missing:
                from moto.emr.exceptions import ValidationException

                raise ValidationException(
                    f"The EMR service role {role.name} has {V2_POLICY}, which lets EMR use "
                    f"only subnets and security groups tagged {TAG_KEY}=true; not tagged: "
                    f"{', '.join(missing)}")
        return original(self, **kwargs)

    return run_job_flow


def install() -> None:
    """Patch moto's EMR backend in this process (idempotent)."""
    global _INSTALLED
    if _INSTALLED:
        return
    from moto.emr.models import ElasticMapReduceBackend
    from moto.iam.models import Role

    ElasticMapReduceBackend.run_job_flow = _wrap_run_job_flow(  # type: ignore[method-assign]
        ElasticMapReduceBackend.run_job_flow)
    Role.create_from_cloudformation_json = _wrap_cfn_role(  # type: ignore[method-assign]
        Role.__dict__["create_from_cloudformation_json"])
    _INSTALLED = True
