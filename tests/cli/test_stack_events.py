"""What the emulator adds to moto's CloudFormation for dlc's progress and outputs
(emulator/moto_extensions.py): a stack created through a change set (as ``cdk deploy``
does) has its outputs, and creating or deleting it records one event per resource."""

from __future__ import annotations

import json

import boto3

TEMPLATE = {"Resources": {"Q": {"Type": "AWS::SQS::Queue"},
                          "Kept": {"Type": "AWS::SQS::Queue", "DeletionPolicy": "Retain"}},
            "Outputs": {"QueueUrl": {"Value": {"Ref": "Q"}}}}


def test_change_set_stack_has_outputs_and_resource_events(moto_reset: str) -> None:
    cfn = boto3.client("cloudformation", endpoint_url=moto_reset, region_name="us-east-1")
    cfn.create_change_set(StackName="S", ChangeSetName="cs", ChangeSetType="CREATE",
                          TemplateBody=json.dumps(TEMPLATE))
    cfn.execute_change_set(ChangeSetName="cs", StackName="S")
    stack = cfn.describe_stacks(StackName="S")["Stacks"][0]
    assert [o["OutputKey"] for o in stack["Outputs"]] == ["QueueUrl"]
    cfn.delete_stack(StackName="S")
    events = [(e["LogicalResourceId"], e["ResourceStatus"]) for e in
              reversed(cfn.describe_stack_events(StackName=stack["StackId"])["StackEvents"])]
    assert [e for e in events if e[0] != "S"] == [
        ("Q", "CREATE_COMPLETE"), ("Kept", "CREATE_COMPLETE"),
        ("Q", "DELETE_COMPLETE"), ("Kept", "DELETE_SKIPPED")]
    assert events[-1] == ("S", "DELETE_COMPLETE")
