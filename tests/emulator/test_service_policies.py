"""How the emulator decides whether a resource policy lets an AWS service act (a table),
never kinder than AWS: an unknown operator never allows and always denies."""

from __future__ import annotations

import pytest

from emulator.service_policies import decide

TOPIC = "arn:aws:sns:us-east-1:123456789012:alarms"
ALARM = "arn:aws:cloudwatch:us-east-1:123456789012:alarm:NodeUnhealthy"
CONTEXT = {"aws:SourceAccount": "123456789012", "aws:SourceOwner": "123456789012",
           "aws:SourceArn": ALARM, "aws:SecureTransport": "true"}
CLOUDWATCH = {"Effect": "Allow", "Principal": {"Service": "cloudwatch.amazonaws.com"},
              "Action": "sns:Publish", "Resource": TOPIC,
              "Condition": {"StringEquals": {"aws:SourceAccount": "123456789012"},
                            "ArnLike": {"aws:SourceArn":
                                        "arn:aws:cloudwatch:us-east-1:123456789012:alarm:*"}}}
SSL = {"Effect": "Deny", "Principal": "*", "Action": "sns:Publish", "Resource": TOPIC,
       "Condition": {"Bool": {"aws:SecureTransport": "false"}}}
BUDGETS = {**CLOUDWATCH, "Principal": {"Service": "budgets.amazonaws.com"}}
DEFAULT = {"Effect": "Allow", "Principal": {"AWS": "*"}, "Action": ["SNS:Publish"],
           "Resource": TOPIC, "Condition": {"StringEquals": {
               "AWS:SourceOwner": "123456789012"}}}


@pytest.mark.parametrize(("statements", "context", "allowed"), [
    ([SSL, CLOUDWATCH], CONTEXT, True),
    ([SSL, BUDGETS], CONTEXT, False),  # the stack's policy before it named CloudWatch
    ([SSL], CONTEXT, False),
    ([DEFAULT], CONTEXT, True),  # SNS's default policy: the account's own sources
    ([CLOUDWATCH], {**CONTEXT, "aws:SourceAccount": "999999999999"}, False),
    ([CLOUDWATCH], {**CONTEXT, "aws:SourceArn": ALARM.replace("us-east-1", "eu-west-1")},
     False),
    ([CLOUDWATCH, {**SSL, "Condition": {}}], CONTEXT, False),  # an explicit deny wins
    ([{**CLOUDWATCH, "Condition": {"NumericLessThan": {"aws:EpochTime": "1"}}}], CONTEXT,
     False),  # an operator the emulator does not know never allows
    ([CLOUDWATCH, {**SSL, "Condition": {"DateLessThan": {"aws:CurrentTime": "x"}}}],
     CONTEXT, False),  # ... and always denies
    ([{**CLOUDWATCH, "Action": "kms:GenerateDataKey*", "Resource": "*"}], CONTEXT, False),
])
def test_decide(statements: list[dict], context: dict, allowed: bool) -> None:
    why = decide({"Statement": statements}, service="cloudwatch.amazonaws.com",
                 action="sns:Publish", resource=TOPIC, context=context)
    assert (why == "") == allowed, why


def test_a_key_policy_statement_with_a_wildcard_action_allows_generate_data_key() -> None:
    statement = {**CLOUDWATCH, "Action": ["kms:GenerateDataKey*", "kms:Decrypt"],
                 "Resource": "*"}
    assert decide({"Statement": [statement]}, service="cloudwatch.amazonaws.com",
                  action="kms:GenerateDataKey", resource="*", context=CONTEXT) == ""
