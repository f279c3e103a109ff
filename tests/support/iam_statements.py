"""Reading IAM statements out of a synthesized template: the SQS actions a policy allows on
a queue, the S3 and KMS statements of a node role."""

from __future__ import annotations

import json

from aws_cdk.assertions import Template

CONSUME = {"sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility"}


def actions_on(t: Template, policy_fragment: str, resource: dict) -> set[str]:
    found = [p for k, p in t.find_resources("AWS::IAM::Policy").items() if policy_fragment in k]
    assert len(found) == 1, policy_fragment
    out: set[str] = set()
    for st in found[0]["Properties"]["PolicyDocument"]["Statement"]:
        res = st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]]
        if resource in res or "*" in res:
            acts = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
            out |= {a for a in acts if a.startswith("sqs:")}
    return out


def s3_statements(t: Template, role_fragment: str) -> list[dict]:
    (policy,) = [p for k, p in t.find_resources("AWS::IAM::Policy").items()
                 if role_fragment in k and ("InstanceRole" in k or "JobRole" in k)]
    out = []
    for st in policy["Properties"]["PolicyDocument"]["Statement"]:
        actions = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
        if any(a.startswith(("s3:", "kms:")) for a in actions) and st.get("Sid") != \
                "ReadNodeScripts" and "Topic" not in json.dumps(st["Resource"]):
            out.append({"Sid": st.get("Sid"), "Action": sorted(actions),
                        "Resource": json.dumps(st["Resource"]),
                        "Condition": st.get("Condition")})
    return out

