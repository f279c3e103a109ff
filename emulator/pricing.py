"""The AWS Price List Query API's ``GetProducts`` for the emulator's moto server.

moto has no Price List service, so without this ``dlc status`` against the emulator could
only ever say "cost: unknown". AWS serves the API from ``api.pricing.us-east-1.amazonaws.com``
as JSON 1.1 (``X-Amz-Target: AWSPriceListService.GetProducts``,
https://docs.aws.amazon.com/aws-cost-management/latest/APIReference/API_pricing_GetProducts.html);
here every request with that target, whatever its host, is answered from :data:`PRICES`, in
the shape of the Price List's product documents
(https://docs.aws.amazon.com/awsaccountbilling/latest/aboutv2/reading-an-offer.html):
``PriceList`` is a list of JSON strings, each a product with its attributes and its
``terms.OnDemand`` price dimensions. ``TERM_MATCH`` filters select on the attributes; a
type the table lacks gets an empty ``PriceList``, as a type AWS does not sell there would.
Every product here is On-Demand (``marketoption`` ``OnDemand``): the table has no Capacity
Block rates, so a ``CapacityBlock`` query gets an empty list (no emulated node is in one).

The prices are a snapshot of the published us-east-1 on-demand Linux prices of the instance
types the demo and the tests launch (the emulator's stand-in, like its instance types' GPU
counts; dlc never knows where a price came from).
"""

from __future__ import annotations

import json
import zlib
from typing import Any

#: (regionCode, instanceType) -> USD per hour, Linux, shared tenancy, on demand.
PRICES: dict[tuple[str, str], str] = {
    ("us-east-1", "g5.xlarge"): "1.0060000000",
    ("us-east-1", "g4dn.xlarge"): "0.5260000000",
    ("us-east-1", "g6.xlarge"): "0.8048000000",
}
TARGET_PREFIX = "AWSPriceListService."
#: The attributes every product here has (what ``dlc`` filters on besides type and region).
FIXED_ATTRIBUTES = {"operatingSystem": "Linux", "tenancy": "Shared", "preInstalledSw": "NA",
                    "capacitystatus": "Used", "licenseModel": "No License required",
                    "marketoption": "OnDemand"}


def product(region: str, instance_type: str, usd: str) -> dict[str, Any]:
    """One Price List product document with its on-demand hourly term."""
    sku = f"EMU{zlib.crc32(f'{region}/{instance_type}'.encode()):010d}"
    term = f"{sku}.JRTCKXETXF"
    return {
        "product": {"productFamily": "Compute Instance", "sku": sku, "attributes": {
            "servicecode": "AmazonEC2", "instanceType": instance_type, "regionCode": region,
            **FIXED_ATTRIBUTES}},
        "serviceCode": "AmazonEC2",
        "terms": {"OnDemand": {term: {
            "offerTermCode": "JRTCKXETXF", "sku": sku, "termAttributes": {},
            "priceDimensions": {f"{term}.6YS6EN2CT7": {
                "unit": "Hrs", "pricePerUnit": {"USD": usd}, "rateCode": f"{term}.6YS6EN2CT7",
                "description": f"${usd[:6]} per On Demand Linux {instance_type} Instance Hour",
                "beginRange": "0", "endRange": "Inf", "appliesTo": []}}}}},
    }


def get_products(request: dict[str, Any]) -> dict[str, Any]:
    """GetProducts: the products of ``ServiceCode`` whose attributes match every filter."""
    if request.get("ServiceCode") != "AmazonEC2":
        return {"FormatVersion": "aws_v1", "PriceList": []}
    wanted = {f.get("Field", ""): f.get("Value", "") for f in request.get("Filters", [])
              if f.get("Type") == "TERM_MATCH"}
    out = []
    for (region, instance_type), usd in sorted(PRICES.items()):
        doc = product(region, instance_type, usd)
        attributes = doc["product"]["attributes"]
        if all(attributes.get(k) == v for k, v in wanted.items()):
            out.append(json.dumps(doc))
    return {"FormatVersion": "aws_v1", "PriceList": out[:int(request.get("MaxResults", 100))]}


def answer(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    """The WSGI answer to a Price List request."""
    action = environ.get("HTTP_X_AMZ_TARGET", "")[len(TARGET_PREFIX):]
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        request = json.loads(environ["wsgi.input"].read(length) or b"{}")
    except ValueError:
        request = None
    if action != "GetProducts" or not isinstance(request, dict):
        status, body = "400 Bad Request", {
            "__type": "InvalidParameterException",
            "Message": f"the emulator's Price List answers GetProducts only, not {action!r}"}
    else:
        status, body = "200 OK", get_products(request)
    data = json.dumps(body).encode()
    start_response(status, [("Content-Type", "application/x-amz-json-1.1"),
                            ("Content-Length", str(len(data)))])
    return [data]


def install() -> None:
    """Route Price List requests to :func:`answer` in moto's server (this process)."""
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication

    original = DomainDispatcherApplication.__call__
    if getattr(original, "emulator_pricing", False):
        return

    def __call__(self: Any, environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("HTTP_X_AMZ_TARGET", "").startswith(TARGET_PREFIX):
            return answer(environ, start_response)
        return original(self, environ, start_response)

    __call__.emulator_pricing = True  # type: ignore[attr-defined]
    DomainDispatcherApplication.__call__ = __call__  # type: ignore[method-assign]
