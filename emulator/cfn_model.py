"""One way to teach moto's CloudFormation a resource type it lacks: :func:`cfn_model`.

moto 5.2 finds a type's model among the direct subclasses of its ``CloudFormationModel``
(``moto.cloudformation.parsing.get_model_list``), keyed by ``cloudformation_type()``; a
type it has no model for is skipped with a warning, and a template that refers to it
(``Ref``, ``Fn::GetAtt``) then fails to deploy. Each emulated type (a lifecycle hook, a
warm pool, an alarm, a placement group, an EventInvokeConfig) differs only in what it does
on its backend when the stack creates and deletes it; the rest of the model (its type, the
name property, the attributes ``Fn::GetAtt`` may ask for, the physical id) is this one
class, made by :func:`cfn_model` as a direct subclass, which is how moto's list sees it.
The caller clears moto's model caches after making one (``parsing.get_model_list`` and
the maps built from it are ``lru_cache``d).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

#: ``create(resource name, properties, account id, region)``: the resource made on moto's
#: backend; returns its physical id, or (physical id, {attribute: value for Fn::GetAtt}).
Create = Callable[[str, dict[str, Any], str, str], str | tuple[str, Mapping[str, Any]]]
#: ``delete(resource name, properties, account id, region)``: the resource removed.
Delete = Callable[[str, dict[str, Any], str, str], None]


def cfn_model(cfn_type: str, *, create: Create, delete: Delete | None = None,
              name_type: str = "", attributes: tuple[str, ...] | None = None) -> type:
    """A moto model of ``cfn_type`` (``AWS::Service::Resource``); defining it registers it.

    ``name_type``: the property that names the resource ("" for none); ``attributes``: the
    names ``Fn::GetAtt`` may ask for, their values from ``create`` (None: moto's default,
    every attribute accepted when the template is checked); ``delete``: None for a resource
    with nothing to remove (moto's default does nothing)."""
    from moto.core.common_models import CloudFormationModel

    def init(self: Any, physical_id: str, values: Mapping[str, Any]) -> None:
        self.physical_id, self.attributes = physical_id, dict(values)

    def create_from_cloudformation_json(cls: Any, resource_name: str,
                                        cloudformation_json: dict[str, Any], account_id: str,
                                        region_name: str, **kwargs: Any) -> Any:
        made = create(resource_name, cloudformation_json.get("Properties") or {}, account_id,
                      region_name)
        return cls(made, {}) if isinstance(made, str) else cls(*made)

    namespace: dict[str, Any] = {
        "__init__": init,
        "__doc__": f"``{cfn_type}`` as moto's CloudFormation deploys it (``cfn_model``).",
        "cloudformation_name_type": staticmethod(lambda: name_type),
        "cloudformation_type": staticmethod(lambda: cfn_type),
        "create_from_cloudformation_json": classmethod(create_from_cloudformation_json),
        "physical_resource_id": property(lambda self: self.physical_id),
    }
    if delete is not None:
        def delete_from_cloudformation_json(cls: Any, resource_name: str,
                                            cloudformation_json: dict[str, Any],
                                            account_id: str, region_name: str) -> None:
            delete(resource_name, cloudformation_json.get("Properties") or {}, account_id,
                   region_name)

        namespace["delete_from_cloudformation_json"] = classmethod(
            delete_from_cloudformation_json)
    if attributes is not None:
        def get_cfn_attribute(self: Any, attribute_name: str) -> Any:
            if attribute_name in self.attributes:
                return self.attributes[attribute_name]
            from moto.cloudformation.exceptions import UnformattedGetAttTemplateException

            raise UnformattedGetAttTemplateException()

        namespace["has_cfn_attr"] = classmethod(lambda cls, attr: attr in attributes)
        namespace["get_cfn_attribute"] = get_cfn_attribute
    name = cfn_type.rsplit("::", 1)[-1] + "Resource"
    return type(CloudFormationModel)(name, (CloudFormationModel,), namespace)
