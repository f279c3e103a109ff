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
skipped. Update and delete do nothing (the project declares neither). Other ``Custom::``
types keep moto's own handling.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

CUSTOM_AWS = "Custom::AWS"
_INSTALLED = False


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


def _wrap_create(original: Any) -> Any:
    def create_from_cloudformation_json(cls: Any, resource_name: str, cloudformation_json: Any,
                                        account_id: str, region_name: str,
                                        **kwargs: Any) -> Any:
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
    _INSTALLED = True
