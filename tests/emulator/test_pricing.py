"""The emulator's Price List ``GetProducts`` (moto has none): over HTTP, through boto3, in
the shape ``dlc``'s cost estimate parses."""

from __future__ import annotations

import json
from decimal import Decimal

import boto3
import pytest

from dlc.cost import parse_on_demand
from emulator.pricing import PRICES
from tests.support.quotas import operator_quotas

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


def test_the_job_controllers_price_book_prices_a_node_from_the_emulator(
        moto_endpoint: str, tmp_path) -> None:
    """What the master's controller asks (ops/prices.py): DescribeInstances, then the
    Price List with the market option; moto's own DescribeSpotPriceHistory for Spot."""
    import time

    from bootstrap_scripts.ops.cost import Market
    from bootstrap_scripts.ops.prices import PriceBook
    from bootstrap_scripts.protocol.membership import Node

    def client(service: str, region: str):
        return boto3.client(service, region_name=region, endpoint_url=moto_endpoint,
                            aws_access_key_id="testing", aws_secret_access_key="testing")

    ec2 = client("ec2", "us-east-1")
    operator_quotas(moto_endpoint)  # a g5.xlarge fits the account's vCPU quotas
    image = ec2.describe_images()["Images"][0]["ImageId"]
    (inst,) = ec2.run_instances(ImageId=image, InstanceType="g5.xlarge", MinCount=1,
                                MaxCount=1)["Instances"]
    try:
        book = PriceBook(tmp_path, "us-east-1", client=client)
        (usage,) = book.node_usage([Node(rank=0, role="master", instance_id=inst["InstanceId"],
                                         address="127.0.0.1", alias="a",
                                         instance_type="g5.xlarge")], time.time())
        assert (usage.market, usage.usd_per_hour, usage.price_note) == (
            "on-demand", "1.006", "")
        zone = inst["Placement"]["AvailabilityZone"]
        spot, source = book.fetch(Market.SPOT, "g5.xlarge", zone, time.time())
        assert Decimal(spot) > 0 and zone in source
        assert book.fetch(Market.CAPACITY_BLOCK, "g5.xlarge", "us-east-1", time.time())[0] \
            is None  # the emulator's table has no Capacity Block rates
    finally:
        ec2.terminate_instances(InstanceIds=[inst["InstanceId"]])
