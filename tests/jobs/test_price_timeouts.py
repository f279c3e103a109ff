"""The job controller's price calls (``ops/prices.py``) run in its loop: an AWS that does not
answer must cost seconds, not botocore's default 60 s read timeout times its retries."""

from __future__ import annotations

from bootstrap_scripts.ops.prices import boto3_client


def test_the_price_clients_give_up_on_a_silent_endpoint_within_seconds():
    for service in ("ec2", "pricing"):
        config = boto3_client(service, "us-east-1").meta.config
        assert (config.connect_timeout, config.read_timeout) == (5, 5)
        assert config.retries["total_max_attempts"] == 2  # one retry
