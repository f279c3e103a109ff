"""What the emulator adds to moto's CloudFormation so that a CDK deploy and destroy behave
as on AWS (part of ``emulator.moto_extensions``, which calls :func:`install`).

Each gap is filled inside the emulator's moto server process, never by changing the product:

- ``Fn::GetAtt [<AWS::EFS::FileSystem>, Arn]``: CloudFormation documents ``Arn`` as a return
  value of ``AWS::EFS::FileSystem``
  (https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/aws-resource-efs-filesystem.html#aws-resource-efs-filesystem-return-values);
  moto 5.2's EFS model has no ``get_cfn_attribute``, so a template whose IAM policy grants on
  the file system's ARN (CDK's ``grant_root_access``) fails to deploy. The emulator answers
  with the ARN moto already computes for the file system (``FileSystemArn`` in
  DescribeFileSystems).
- ``Fn::GetAtt [<AWS::Logs::LogGroup>, Arn]``: CloudFormation returns the group's ARN with
  ``:*`` at the end (``arn:aws:logs:REGION:ACCOUNT:log-group:NAME:*``,
  https://docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/aws-resource-logs-loggroup.html#aws-resource-logs-loggroup-return-values),
  which is what makes a grant on it cover the group's streams; moto returns it without, so
  with IAM enforced (``emulator.iam_enforcement``) a node's CreateLogStream would be refused
  where AWS allows it. The emulator answers as CloudFormation does.
- ``AWS::Lambda::EventInvokeConfig`` (the capacity adjuster's retries, maximum event age
  and on-failure destination,
  https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/aws-resource-lambda-eventinvokeconfig.html):
  moto's CloudFormation skips the type with a warning, though its Lambda backend has
  PutFunctionEventInvokeConfig; the resource is created through that, so
  GetFunctionEventInvokeConfig answers for the deployed function as on AWS.
- Stack outputs of a stack created through a change set (``cdk deploy``): moto builds the
  stack's outputs from its empty placeholder template and never again, so DescribeStacks
  lists none; after ExecuteChangeSet they are built from the executed template, as AWS
  shows them (https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/outputs-section-structure.html).
- Resource events: moto records the stack's own events only; AWS records one per resource
  (https://docs.aws.amazon.com/AWSCloudFormation/latest/APIReference/API_DescribeStackEvents.html).
  A created stack gets ``CREATE_COMPLETE`` for each template resource, a deleted one
  ``DELETE_COMPLETE`` (``DELETE_SKIPPED`` for ``DeletionPolicy: Retain``). (A group's
  hooks go before the group: ``emulator.lifecycle_hooks``.)
- ``DependsOn`` on a stack created or updated through a change set (``cdk deploy``): moto
  creates the added resources in template order there (it honours ``DependsOn`` only in
  CreateStack), so a resource could be created before one it depends on. CloudFormation
  creates a resource only after every resource its ``DependsOn`` names
  (https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/aws-attribute-dependson.html):
  the added resources are put in that order (:func:`dependency_order`).
- moto cannot delete a template's route tables and NAT gateway, so they are deleted with the
  stack's VPC (CloudFormation deletes them before it on AWS).
- ``AWS::S3::Bucket``'s ``VersioningConfiguration`` and ``PublicAccessBlockConfiguration``
  (https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/aws-resource-s3-bucket.html):
  moto's CloudFormation applies only the encryption and tags, so a bucket the template makes
  versioned keeps one version per key; the emulator applies both through moto's own S3
  backend (PutBucketVersioning, PutPublicAccessBlock) after moto created the bucket.
- ``AWS::AutoScaling::AutoScalingGroup``'s ``MetricsCollection``
  (https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/aws-properties-as-metricscollection.html):
  moto's CloudFormation drops it, so DescribeAutoScalingGroups lists no ``EnabledMetrics``;
  the emulator enables the listed metrics (all of them when none are listed, as
  CloudFormation does) through moto's own EnableMetricsCollection, so the group metrics
  ``emulator.alarm_evaluator`` publishes are the ones the template asked for.
- ``AWS::SNS::TopicPolicy`` (moto skips it, so a topic kept moto's default policy): the
  document becomes the topics' policy, ``emulator.service_policies``.
- A stack's deletion in CloudFormation's order (dependents first) and its failure
  (``DELETE_FAILED``, the stack kept): ``emulator.cfn_deletion``.
- ``AWS::CloudWatch::Alarm``: moto skips the type, so a dashboard showing an alarm cannot
  deploy; ``emulator.moto_alarms`` creates it through moto's CloudWatch backend.
"""

from __future__ import annotations

import contextlib
from typing import Any

from emulator import cfn_deletion, moto_alarms, service_policies
from emulator.cfn_model import cfn_model

# -- EFS ------------------------------------------------------------------------------------


def _efs_get_cfn_attribute(self: Any, attribute_name: str) -> Any:
    if attribute_name == "Arn":
        return self.file_system_arn
    if attribute_name == "FileSystemId":
        return self.file_system_id
    from moto.cloudformation.exceptions import UnformattedGetAttTemplateException

    raise UnformattedGetAttTemplateException()


def _log_group_get_cfn_attribute(self: Any, attribute_name: str) -> Any:
    if attribute_name == "Arn":
        return f"{self.arn}:*"
    from moto.cloudformation.exceptions import UnformattedGetAttTemplateException

    raise UnformattedGetAttTemplateException()


def _resource_events(stack: Any, status_of: Any, *, before_last: bool) -> None:
    """One event per resource of the stack's template, with ``status_of(resource json)``."""
    from moto.cloudformation.models import Event

    events = [Event(stack.stack_id, stack.name, logical_id, "", res.get("Type", ""),
                    status_of(res), None, None)
              for logical_id, res in (stack.template_dict.get("Resources") or {}).items()]
    at = len(stack.events) - 1 if before_last and stack.events else len(stack.events)
    stack.events[at:at] = events


def _wrap_execute_change_set(original: Any) -> Any:
    def execute_change_set(self: Any, change_set_name: str, stack_name: str | None = None):
        kinds = {cs.stack_id: cs.change_set_type for cs in self.change_sets.values()
                 if change_set_name in (cs.change_set_name, cs.change_set_id)}
        original(self, change_set_name, stack_name)
        for stack in self.stacks.values():  # the executed one: outputs from its template
            if stack.stack_id in kinds:
                stack._parse_template()
                stack.output_map = stack._create_output_map()
                if kinds[stack.stack_id] == "CREATE":
                    _resource_events(stack, lambda res: "CREATE_COMPLETE", before_last=True)

    return execute_change_set


def _wrap_delete_stack(original: Any) -> Any:
    def delete_stack(self: Any, name_or_stack_id: str) -> None:
        for stack in list(self.stacks.values()):
            if name_or_stack_id in (stack.name, stack.stack_id) and \
                    not getattr(stack, "emulator_delete_events", False):
                stack.emulator_delete_events = True  # moto calls itself again by id
                _resource_events(stack, lambda res: "DELETE_SKIPPED" if res.get(
                    "DeletionPolicy") == "Retain" else "DELETE_COMPLETE", before_last=False)
        original(self, name_or_stack_id)

    return delete_stack


# -- AWS::Lambda::EventInvokeConfig ---------------------------------------------------------


def _event_invoke_config_model() -> type:
    """``AWS::Lambda::EventInvokeConfig`` for moto's CloudFormation, on its Lambda backend."""
    from moto.awslambda.models import lambda_backends

    keys = ("DestinationConfig", "MaximumEventAgeInSeconds", "MaximumRetryAttempts")

    def create(resource_name: str, p: dict[str, Any], account_id: str, region: str) -> str:
        lambda_backends[account_id][region].put_function_event_invoke_config(
            p["FunctionName"], {k: p[k] for k in keys if k in p})
        return p["FunctionName"]

    def delete(resource_name: str, p: dict[str, Any], account_id: str, region: str) -> None:
        name = p["FunctionName"]
        if not isinstance(name, str):  # an unresolved Ref at delete: the physical id
            name = resource_name
        from moto.awslambda.exceptions import UnknownFunctionException

        # the function may have gone first, and its configuration with it
        with contextlib.suppress(UnknownFunctionException):
            lambda_backends[account_id][region].delete_function_event_invoke_config(name)

    return cfn_model("AWS::Lambda::EventInvokeConfig", create=create, delete=delete)


# -- deleting a stack's VPC ---------------------------------------------------------------------


def _wrap_vpc_delete(original: Any) -> Any:
    def delete_from_cloudformation_json(cls: Any, resource_name: str,
                                        cloudformation_json: dict[str, Any], account_id: str,
                                        region_name: str) -> None:
        """moto's AWS::EC2::RouteTable and AWS::EC2::NatGateway have no CloudFormation delete,
        so a stack's VPC could never be deleted; CloudFormation deletes them before the VPC
        on AWS, so here they go with it (the stack's own VPC: nothing else is in it)."""
        from moto.ec2.models import ec2_backends

        ec2 = ec2_backends[account_id][region_name]
        for nat in list(ec2.nat_gateways.values()):
            if nat.vpc_id == resource_name and nat.state != "deleted":
                ec2.delete_nat_gateway(nat.id)
        for table in list(ec2.route_tables.values()):
            if table.vpc_id == resource_name and table.main_association_id is None:
                for association in list(table._associations):
                    ec2.disassociate_route_table(association)
                ec2.delete_route_table(table.id)
        original(resource_name, cloudformation_json, account_id, region_name)

    return classmethod(delete_from_cloudformation_json)


def dependency_order(names: list[str], resources: dict[str, Any]) -> list[str]:
    """``names`` with every resource after the ones its ``DependsOn`` names (stable: the
    template order otherwise)."""
    wanted, done, out = set(names), set(), []

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in done or name not in wanted or name in path:
            return
        depends = (resources.get(name) or {}).get("DependsOn") or []
        for dep in [depends] if isinstance(depends, str) else depends:
            visit(dep, (*path, name))
        done.add(name)
        out.append(name)

    for name in names:
        visit(name, ())
    return out


def _wrap_resource_diff(original: Any) -> Any:
    def build_resource_diff(self: Any, other_template: dict[str, Any], *args: Any,
                            **kwargs: Any) -> dict[str, Any]:
        diff = original(self, other_template, *args, **kwargs)
        diff["Add"] = dependency_order(diff["Add"], other_template.get("Resources") or {})
        return diff

    return build_resource_diff


def _wrap_bucket_create(original: Any) -> Any:
    def create_from_cloudformation_json(cls: Any, resource_name: str, cloudformation_json: Any,
                                        account_id: str, region_name: str, **kwargs: Any) -> Any:
        from moto.s3.models import s3_backends
        from moto.utilities.utils import get_partition

        bucket = original.__func__(cls, resource_name, cloudformation_json, account_id,
                                   region_name, **kwargs)
        props = cloudformation_json.get("Properties", {})
        backend = s3_backends[account_id][get_partition(region_name)]
        status = (props.get("VersioningConfiguration") or {}).get("Status")
        if status:
            backend.put_bucket_versioning(bucket.name, status)
        block = props.get("PublicAccessBlockConfiguration")
        if block:
            backend.put_public_access_block(bucket.name, {
                k: str(v).lower() == "true" for k, v in block.items()})
        return bucket

    return classmethod(create_from_cloudformation_json)


def _wrap_group_create(original: Any) -> Any:
    def create_from_cloudformation_json(cls: Any, resource_name: str, cloudformation_json: Any,
                                        account_id: str, region_name: str, **kwargs: Any) -> Any:
        from emulator.alarm_evaluator import GROUP_METRICS

        group = original.__func__(cls, resource_name, cloudformation_json, account_id,
                                  region_name, **kwargs)
        for entry in cloudformation_json.get("Properties", {}).get("MetricsCollection") or []:
            group.enable_metrics_collection(list(entry.get("Metrics") or GROUP_METRICS))
        return group

    return classmethod(create_from_cloudformation_json)


_installed = False


def install() -> None:
    """Patch moto's CloudFormation-side models in this process, once: a second call would
    wrap the wrappers (two events per resource), and tests call it beside
    ``moto_extensions.install``."""
    global _installed
    if _installed:
        return
    _installed = True
    from moto.cloudformation.models import CloudFormationBackend
    from moto.cloudformation.parsing import ResourceMap
    from moto.ec2.models.vpcs import VPC
    from moto.efs.models import FileSystem
    from moto.logs.models import LogGroup
    from moto.s3.models import FakeBucket

    FileSystem.get_cfn_attribute = _efs_get_cfn_attribute  # type: ignore[method-assign]
    FileSystem.has_cfn_attr = classmethod(  # type: ignore[method-assign,assignment]
        lambda cls, attr: attr in ("Arn", "FileSystemId"))
    LogGroup.get_cfn_attribute = _log_group_get_cfn_attribute  # type: ignore[method-assign]
    ResourceMap.build_resource_diff = _wrap_resource_diff(  # type: ignore[method-assign]
        ResourceMap.build_resource_diff)
    CloudFormationBackend.execute_change_set = _wrap_execute_change_set(  # type: ignore[method-assign]
        CloudFormationBackend.execute_change_set)
    CloudFormationBackend.delete_stack = cfn_deletion.wrap_delete_stack(  # type: ignore[method-assign]
        _wrap_delete_stack(CloudFormationBackend.delete_stack))
    ResourceMap.delete = cfn_deletion.ordered_delete  # type: ignore[method-assign]
    VPC.delete_from_cloudformation_json = _wrap_vpc_delete(  # type: ignore[method-assign]
        VPC.delete_from_cloudformation_json)
    if not getattr(FakeBucket.create_from_cloudformation_json, "_dl_wrapped", False):
        wrapped = _wrap_bucket_create(FakeBucket.create_from_cloudformation_json)
        wrapped.__func__._dl_wrapped = True  # type: ignore[attr-defined]
        FakeBucket.create_from_cloudformation_json = wrapped  # type: ignore[method-assign]
    from moto.autoscaling.models import FakeAutoScalingGroup

    if not getattr(FakeAutoScalingGroup.create_from_cloudformation_json, "_dl_wrapped", False):
        wrapped = _wrap_group_create(FakeAutoScalingGroup.create_from_cloudformation_json)
        wrapped.__func__._dl_wrapped = True  # type: ignore[attr-defined]
        FakeAutoScalingGroup.create_from_cloudformation_json = wrapped  # type: ignore[method-assign]
    _event_invoke_config_model()  # a CloudFormationModel subclass: moto's model list finds it
    moto_alarms.alarm_model()  # the same for AWS::CloudWatch::Alarm
    service_policies.install()  # and AWS::SNS::TopicPolicy
    from moto.cloudformation import parsing

    for cached in (parsing.get_model_list, parsing.get_model_map, parsing.get_name_type_map):
        cached.cache_clear()
