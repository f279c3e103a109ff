"""The emulator's Price List ``GetProducts`` (moto has none): over HTTP, through boto3, in
the shape ``dlc``'s cost estimate parses."""

from __future__ import annotations

import json
from decimal import Decimal

import boto3
import pytest

from dlc.cost import parse_on_demand
from emulator.pricing import PRICES

LINUX = [("operatingSystem", "Linux"), ("tenancy", "Shared"), ("preInstalledSw", "NA"),
         ("capacitystatus", "Used"), ("licenseModel", "No License required")]


def products(endpoint: str, service: str = "AmazonEC2", **fields: str) -> list[str]:
    client = boto3.client("pricing", region_name="us-east-1", endpoint_url=endpoint)
    filters = [{"Type": "TERM_MATCH", "Field": k, "Value": v}
               for k, v in [*fields.items(), *LINUX]]
    return client.get_products(ServiceCode=service, Filters=filters,
                               MaxResults=10)["PriceList"]


def test_a_known_type_has_its_on_demand_hourly_price(moto_endpoint: str) -> None:
    found = products(moto_endpoint, instanceType="g5.xlarge", regionCode="us-east-1")
    assert len(found) == 1
    doc = json.loads(found[0])
    assert doc["product"]["attributes"]["instanceType"] == "g5.xlarge"
    assert parse_on_demand(found) == Decimal(PRICES[("us-east-1", "g5.xlarge")])


@pytest.mark.parametrize("fields,service", [
    ({"instanceType": "p5.48xlarge", "regionCode": "us-east-1"}, "AmazonEC2"),
    ({"instanceType": "g5.xlarge", "regionCode": "eu-west-1"}, "AmazonEC2"),
    ({"instanceType": "g5.xlarge", "regionCode": "us-east-1"}, "AmazonS3"),
])
def test_what_the_table_lacks_is_an_empty_answer_not_a_made_up_price(
        moto_endpoint: str, fields: dict, service: str) -> None:
    assert products(moto_endpoint, service, **fields) == []


def test_other_services_are_still_moto(moto_endpoint: str) -> None:
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=moto_endpoint)
    assert ec2.describe_regions()["Regions"]
