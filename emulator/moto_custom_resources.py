"""CloudFormation's ``Custom::AWS`` resources (CDK's ``AwsCustomResource``) in the emulator
(part of ``emulator.moto_extensions``, which calls :func:`install`).

On AWS, CloudFormation invokes the custom resource's provider function (CDK's Node.js
handler), which makes the SDK call the resource declares (``Create``: service, action,
parameters, ``ignoreErrorCodesMatching``) and reports back
(https://docs.aws.amazon.com/cdk/api/v2/docs/aws-cdk-lib.custom_resources.AwsCustomResource.html,
https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/template-custom-resources.html).
moto can only run a function in Docker, which the emulator does not use, so the declared
call would never be made and whatever depends on it would be created against a state AWS
would not have.

Here the emulator plays that provider for the calls it knows (:data:`CALLS`), synchronously
and against moto's own backends: an error whose code matches ``ignoreErrorCodesMatching`` is
accepted as the handler accepts it; any other error fails the resource (and so the stack),
and a call the emulator does not know fails it too, naming the call, rather than being
skipped. Update and delete do nothing (the project declares neither).

A custom resource whose ``ServiceToken`` is a function the emulator can run (the capacity
adjuster, the EMR stack's ``emr_teardown``: :data:`FUNCTION_HANDLERS`) is answered by the
project's own request code (``lambda_src.custom_resources.respond``:
``Custom::ClusterRelease``, ``Custom::QuotaCheck``, ``Custom::ServiceRoleGrant``,
``Custom::EfsAccessCheck``, ``Custom::CapacityBlockEnd``, ``Custom::EmrSecurityGroupRelease``)
on Create and on Delete,
with a boto3 client of this moto server (:func:`serve_at`; the harness's keys, which act
as the account's administrator when IAM is enforced, not the function's role). The
emulator plays
CloudFormation's side: it reads the response object directly instead of through a
presigned URL. A FAILED answer fails the create (the stack rolls back) or the delete (the
stack is ``DELETE_FAILED``, ``emulator.cfn_deletion``). Other ``Custom::`` types keep moto's
own handling.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from typing import Any

CUSTOM_AWS = "Custom::AWS"
#: Lambda handlers whose custom-resource requests the emulator answers in-process.
FUNCTION_HANDLERS = ("capacity_adjuster.handler", "emr_teardown.handler")
_INSTALLED = False
_ENDPOINT: list[str] = []  # this moto server's URL, once it serves


class CustomResourceError(RuntimeError):
    """The declared call failed (or is unknown to the emulator); names the resource."""


def _iam_create_service_linked_role(account: str, region: str, params: dict) -> dict:
    from moto.iam.models import iam_backends

    backend = iam_backends[account]["aws"]
    role = backend.create_service_linked_role(params["AWSServiceName"],
                                              params.get("Description", ""),
                                              params.get("CustomSuffix", ""))
    return {"Role.RoleName": role.name, "Role.Arn": role.arn}


#: (service, action) as CDK declares them (``IAM`` / ``@aws-sdk/client-iam``, any case of
#: the action's first letter) -> the call against moto's backends.
CALLS: dict[tuple[str, str], Callable[[str, str, dict], dict]] = {
    ("iam", "createservicelinkedrole"): _iam_create_service_linked_role,
}


def normalise(service: str, action: str) -> tuple[str, str]:
    return service.removeprefix("@aws-sdk/client-").lower(), action.lower()


def error_code(exc: BaseException) -> str:
    """The AWS error code of a moto exception (``code`` / ``error_type``), else its class."""
    return str(getattr(exc, "code", "") or getattr(exc, "error_type", "")
               or type(exc).__name__)


def play(logical_id: str, properties: dict, account: str, region: str) -> dict:
    """Make the ``Create`` call of one ``Custom::AWS`` resource; returns its data."""
    create = properties.get("Create")
    if isinstance(create, str):
        create = json.loads(create)
    if not isinstance(create, dict):
        return {}  # no create call declared: nothing to do, as the handler does nothing
    service, action = str(create.get("service", "")), str(create.get("action", ""))
    call = CALLS.get(normalise(service, action))
    if call is None:
        raise CustomResourceError(
            f"{logical_id}: the emulator cannot play {service}.{action} for a Custom::AWS "
            f"resource (emulator/moto_custom_resources.py lists the calls it can)")
    ignore = create.get("ignoreErrorCodesMatching") or ""
    try:
        return call(account, region, dict(create.get("parameters") or {}))
    except Exception as exc:
        code = error_code(exc)
        if ignore and re.search(ignore, code):
            return {}
        raise CustomResourceError(f"{logical_id}: {service}.{action} failed: {code}: {exc}") \
            from None


def serve_at(endpoint: str) -> None:
    """Where this process's moto server listens (``emulator.cloud.Cloud``)."""
    _ENDPOINT[:] = [endpoint]


def _function_handler(service_token: Any, account: str, region: str) -> str:
    """The handler of the function ``service_token`` names ("" if none is known)."""
    from moto.awslambda.utils import get_backend

    if not isinstance(service_token, str):
        return ""
    try:
        return str(get_backend(account, region).get_function(service_token).handler or "")
    except Exception:
        return ""


class HarnessClients:
    """boto3 clients of this moto server (the harness's keys), made on first use."""

    def __init__(self, region: str) -> None:
        self.region = region

    def _client(self, service: str) -> Any:
        import boto3

        if not _ENDPOINT:
            raise CustomResourceError("the emulator's moto server has no endpoint to call")
        # the harness's session, token included: with IAM enforced the "testing" keys are the
        # administrator's role session (iam_enforcement.enable), which moto refuses without
        # its token (InvalidClientTokenId: a stack's deletion failed on its release)
        return boto3.client(service, endpoint_url=_ENDPOINT[0], region_name=self.region,
                            aws_access_key_id="testing", aws_secret_access_key="testing",
                            aws_session_token="testing")

    @property
    def autoscaling(self) -> Any:
        return self._client("autoscaling")

    @property
    def ec2(self) -> Any:
        return self._client("ec2")

    @property
    def service_quotas(self) -> Any:
        return self._client("service-quotas")

    @property
    def kms(self) -> Any:
        return self._client("kms")

    @property
    def efs(self) -> Any:
        return self._client("efs")


def answer(kind: str, resource: Any, region: str) -> dict:
    """The function's response object to a ``kind`` request for ``resource``."""
    from lambda_src import custom_resources

    event = {**resource.emulator_request, "RequestType": kind,
             "RequestId": str(uuid.uuid4())}
    if kind != "Create":
        event["PhysicalResourceId"] = resource.emulator_physical_id
    return custom_resources.respond(event, HarnessClients(region))


def _custom_delete(self: Any, account_id: str, region_name: str) -> None:
    """A stack's deletion of a custom resource: the played function's Delete (a FAILED
    answer fails it), nothing for the others."""
    if getattr(self, "emulator_request", None) is None:
        return
    body = answer("Delete", self, region_name)
    if body.get("Status") != "SUCCESS":
        raise CustomResourceError(f"Received response status [FAILED] from custom resource. "
                                  f"Message returned: {body.get('Reason', '')}")


def _played_function(logical_id: str, resource_name: str, properties: dict, account: str,
                     region: str, kwargs: dict) -> Any:
    """Create a custom resource of a function the emulator runs (see the module doc)."""
    from moto.cloudformation import cloudformation_backends
    from moto.cloudformation.custom_model import CustomModel
    from moto.cloudformation.exceptions import ValidationError

    resource = CustomModel(region, "emulator", logical_id, resource_name)
    resource.emulator_request = {  # type: ignore[attr-defined]
        "ServiceToken": properties.get("ServiceToken"), "ResponseURL": "emulator:",
        "StackId": kwargs["StackId"], "LogicalResourceId": logical_id,
        "ResourceType": kwargs["ResourceType"], "ResourceProperties": properties}
    try:
        body = answer("Create", resource, region)
    except CustomResourceError as exc:
        body = {"Status": "FAILED", "Reason": str(exc)}
    if body.get("Status") != "SUCCESS":
        raise ValidationError(message=f"Received response status [FAILED] from custom "
                              f"resource. Message returned: {body.get('Reason', '')}")
    resource.emulator_physical_id = body["PhysicalResourceId"]  # type: ignore[attr-defined]
    resource.resource_name = body["PhysicalResourceId"]
    cloudformation_backends[account][region].get_stack(kwargs["StackId"]) \
        .add_custom_resource(resource)
    resource.set_data(dict(body.get("Data") or {}))
    return resource


def _wrap_create(original: Any) -> Any:
    def create_from_cloudformation_json(cls: Any, resource_name: str, cloudformation_json: Any,
                                        account_id: str, region_name: str,
                                        **kwargs: Any) -> Any:
        properties = cloudformation_json.get("Properties") or {}
        if kwargs.get("ResourceType") != CUSTOM_AWS and _function_handler(
                properties.get("ServiceToken"), account_id, region_name) in FUNCTION_HANDLERS:
            return _played_function(kwargs["LogicalId"], resource_name, properties,
                                    account_id, region_name, kwargs)
        if kwargs.get("ResourceType") != CUSTOM_AWS:
            return original.__func__(cls, resource_name, cloudformation_json, account_id,
                                     region_name, **kwargs)
        from moto.cloudformation import cloudformation_backends
        from moto.cloudformation.custom_model import CustomModel
        from moto.cloudformation.exceptions import ValidationError

        logical_id = kwargs["LogicalId"]
        try:
            data = play(logical_id, cloudformation_json.get("Properties") or {}, account_id,
                        region_name)
        except CustomResourceError as exc:  # fails the stack operation, naming the call
            raise ValidationError(message=f"Received response status [FAILED] from custom "
                                  f"resource: {exc}") from None
        resource = CustomModel(region_name, "emulator", logical_id, resource_name)
        stack = cloudformation_backends[account_id][region_name].get_stack(kwargs["StackId"])
        stack.add_custom_resource(resource)
        resource.set_data(data)
        return resource

    return classmethod(create_from_cloudformation_json)


def install() -> None:
    """Patch moto's custom resource model in this process (idempotent)."""
    global _INSTALLED
    if _INSTALLED:
        return
    from moto.cloudformation.custom_model import CustomModel

    CustomModel.create_from_cloudformation_json = _wrap_create(  # type: ignore[method-assign]
        CustomModel.__dict__["create_from_cloudformation_json"])
    CustomModel.delete = _custom_delete  # type: ignore[attr-defined]
    _INSTALLED = True
