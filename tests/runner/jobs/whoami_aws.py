"""A job that asks AWS who it is, with whatever credentials its environment gives it, and
tries to read the node's own credentials the ways a job could."""

import json
import os
import sys

import boto3

node = os.environ.get("DEEPLEARNING_NODE_RANK", "?")
leaked = sorted(k for k in os.environ if k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                               "AWS_SESSION_TOKEN"))
try:
    arn = boto3.client("sts").get_caller_identity()["Arn"]
except Exception as exc:  # reported: the test judges
    arn = f"ERROR {type(exc).__name__}: {exc}"
print("awsid " + json.dumps({"node": node, "uid": os.getuid(), "arn": arn, "leaked": leaked,
                             "config": os.environ.get("AWS_CONFIG_FILE", "")}), flush=True)
sys.exit(0)
