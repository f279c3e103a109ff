"""``emulator.cfn_model``: a model made by the factory is what moto's CloudFormation finds
for its type, creates and deletes through the module's own functions, and answers
``Fn::GetAtt`` with (in process, no server)."""

from __future__ import annotations

import pytest

from emulator.cfn_model import cfn_model


@pytest.fixture()
def model_caches():
    from moto.cloudformation import parsing

    caches = (parsing.get_model_list, parsing.get_model_map, parsing.get_name_type_map)
    for cached in caches:
        cached.cache_clear()
    yield parsing
    for cached in caches:
        cached.cache_clear()


def test_moto_finds_the_model_and_runs_its_create_and_delete(model_caches):
    made, deleted = [], []

    def create(resource_name, props, account_id, region):
        made.append((resource_name, props, account_id, region))
        return f"{resource_name}-1", {"Arn": "arn:aws:test:::thing/1"}

    def delete(resource_name, props, account_id, region):
        deleted.append((resource_name, props))

    model = cfn_model("Test::Health::Thing", name_type="ThingName", attributes=("Arn",),
                      create=create, delete=delete)
    assert model_caches.get_model_map()["Test::Health::Thing"] is model
    assert model_caches.get_name_type_map()["Test::Health::Thing"] == "ThingName"
    thing = model.create_from_cloudformation_json(
        "Thing", {"Properties": {"Size": 1}}, "123456789012", "us-east-1")
    assert made == [("Thing", {"Size": 1}, "123456789012", "us-east-1")]
    assert thing.physical_resource_id == "Thing-1"
    assert model.has_cfn_attr("Arn") and not model.has_cfn_attr("Name")
    assert thing.get_cfn_attribute("Arn") == "arn:aws:test:::thing/1"
    from moto.cloudformation.exceptions import UnformattedGetAttTemplateException

    with pytest.raises(UnformattedGetAttTemplateException):
        thing.get_cfn_attribute("Name")
    model.delete_from_cloudformation_json("Thing-1", {}, "123456789012", "us-east-1")
    assert deleted == [("Thing-1", {})]


def test_without_attributes_or_delete_moto_keeps_its_defaults(model_caches):
    model = cfn_model("Test::Health::Plain", create=lambda name, *_: name)
    assert model.cloudformation_name_type() == ""
    assert model.has_cfn_attr("Anything")  # moto's default: every attribute accepted
    assert "delete_from_cloudformation_json" not in vars(model)  # moto's: does nothing
    assert model.create_from_cloudformation_json(
        "Plain", {}, "123456789012", "us-east-1").physical_resource_id == "Plain"
