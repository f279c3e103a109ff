"""checkov (an independent IaC scanner from PyPI, in its own venv: ``.venv-checkov``) over
both synthesized templates: every check it fails that we keep, with why, in ONE place.

Each skip names the check, the resources it applies to (a regular expression over
``<type>.<logical id>``) and the reason, with the AWS page that shows it where it matters.
``tests/stack/test_checkov.py`` fails on a failed check no skip covers, and on a skip that
nothing needs any more.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

#: Where ``make checkov-setup`` installs checkov (a venv of its own, apart from the project's
#: dependencies); ``CHECKOV`` overrides it.
REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CHECKOV = REPO_ROOT / ".venv-checkov" / "bin" / "checkov"

CDK_PROVIDER = (r"AWS::Lambda::Function\.CustomVpcRestrictDefaultSGCustomResourceProvider"
                r"Handler[0-9A-F]+")
ADJUSTER = r"AWS::Lambda::Function\.ClusterCapacityAdjusterFunction[0-9A-F]+"
#: The EMR stack's custom-resource function (constructs_lib/emr_teardown.py).
EMR_TEARDOWN = r"AWS::Lambda::Function\.EmrClusterSecurityGroupReleaseFunction[0-9A-F]+"
#: CDK's singleton provider of AwsCustomResource (constructs_lib/service_linked_role.py).
SDK_CALL_PROVIDER = r"AWS::Lambda::Function\.AWS679f53fac002430cb0da5b7982bd2287[0-9A-F]*"


@dataclass(frozen=True)
class Skip:
    check: str
    resources: str
    reason: str

    def covers(self, check: str, resource: str) -> bool:
        return check == self.check and re.fullmatch(self.resources, resource) is not None


SKIPS = (
    Skip("CKV_AWS_27", r"AWS::SQS::Queue\.Cluster(MetadataQueuesMaster(DeadLetters)?|WarmReady"
         r"|NodeKeysQueue)[0-9A-F]+",
         "The queues ARE encrypted at rest, with SQS-managed keys (SqsManagedSseEnabled: "
         "true, https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/"
         "sqs-server-side-encryption.html); checkov 3.3 counts only KmsMasterKeyId. The "
         "capacity adjuster and Auto Scaling's notifications would need kms grants on a "
         "customer key for no gain: the messages hold group names and instance ids (the "
         "warm-ready queue's, an instance id and a hook name; the node-keys queue's, an "
         "instance id and a public key)."),
    Skip("CKV_AWS_116", ADJUSTER,
         "The capacity adjuster is invoked asynchronously by SNS, and its failed invocations "
         "go to an on-failure destination (AWS::Lambda::EventInvokeConfig, the master "
         "queue's encrypted dead-letter queue, which the master reads: docs/capacity-"
         "adjuster.md), AWS's recommended successor to a function DLQ "
         "(https://docs.aws.amazon.com/lambda/latest/dg/invocation-async-retain-records.html); "
         "checkov 3.3 looks only for DeadLetterConfig."),
    Skip("CKV_AWS_117", ADJUSTER,
         "The capacity adjuster calls only AWS APIs (Auto Scaling, EC2, SQS) and reaches "
         "nothing inside the VPC; in a VPC it would need NAT or interface endpoints to reach "
         "them, adding cost and a failure mode, not isolation."),
    Skip("CKV_AWS_115", ADJUSTER,
         "Its invocations are the cluster's own Auto Scaling notifications (a handful per "
         "scaling event); reserved concurrency would take capacity from the account's pool "
         "and throttling would only delay membership changes (the decisions are "
         "idempotent and re-read the groups' state)."),
    Skip("CKV_AWS_173", ADJUSTER,
         "Its environment holds no secret (queue URL, group names, cluster id); Lambda "
         "encrypts environment variables at rest with an AWS managed key by default "
         "(https://docs.aws.amazon.com/lambda/latest/dg/configuration-envvars-encryption.html)."),
    Skip("CKV_AWS_116", CDK_PROVIDER,
         "CDK's own custom-resource handler (restrictDefaultSecurityGroup: it removes the "
         "default security group's rules), invoked synchronously by CloudFormation at "
         "deploy time only: a failure fails the deployment, there is nothing to queue."),
    Skip("CKV_AWS_117", CDK_PROVIDER,
         "CDK's own custom-resource handler calls only the EC2 API at deploy time; it "
         "reaches nothing inside the VPC."),
    Skip("CKV_AWS_115", CDK_PROVIDER,
         "CDK's own custom-resource handler runs once per deployment of the VPC."),
    Skip("CKV_AWS_116", SDK_CALL_PROVIDER,
         "CDK's AwsCustomResource provider, which makes the one CreateServiceLinkedRole call "
         "of a deploy (constructs_lib/service_linked_role.py), invoked synchronously by "
         "CloudFormation: a failure fails the deployment, there is nothing to queue."),
    Skip("CKV_AWS_117", SDK_CALL_PROVIDER,
         "It calls only the IAM API at deploy time; it reaches nothing inside the VPC."),
    Skip("CKV_AWS_115", SDK_CALL_PROVIDER,
         "It runs once per deployment (create only: the role is never updated or deleted)."),
    Skip("CKV_AWS_158", r"AWS::Logs::LogGroup\.AWS679f53fac002430cb0da5b7982bd2287LogGroup"
         r"[0-9A-F]+",
         "The deploy-time log group of CDK's AwsCustomResource provider: it records one "
         "CreateServiceLinkedRole call (service name, no secret) and is encrypted by "
         "CloudWatch Logs with its own keys by default (https://docs.aws.amazon.com/"
         "AmazonCloudWatch/latest/logs/encrypt-log-data-kms.html); a customer key would "
         "need a key policy for a function that lives for one call."),
    Skip("CKV_AWS_116", EMR_TEARDOWN,
         "The EMR stack's custom-resource function (Custom::EmrSecurityGroupRelease), "
         "invoked by CloudFormation at deploy and delete time only: a failure fails the "
         "stack operation, naming the call; there is nothing to queue."),
    Skip("CKV_AWS_117", EMR_TEARDOWN,
         "It calls only the EC2 API (DescribeSecurityGroups, RevokeSecurityGroup*) and "
         "reaches nothing inside the VPC; in the VPC it would need NAT or an endpoint."),
    Skip("CKV_AWS_115", EMR_TEARDOWN,
         "It runs once per create, update and delete of the stack."),
    Skip("CKV_AWS_158", r"AWS::Logs::LogGroup\.EmrClusterSecurityGroupReleaseLogs[0-9A-F]+",
         "The log group of the EMR stack's custom-resource function: it records the security "
         "group rules it revoked at deletion (ids and ports, no secret) and is encrypted by "
         "CloudWatch Logs with its own keys by default (https://docs.aws.amazon.com/"
         "AmazonCloudWatch/latest/logs/encrypt-log-data-kms.html); a customer key would need "
         "a key policy for a function that runs at deploy and delete time only."),
    Skip("CKV_AWS_18", r"AWS::S3::Bucket\.ClusterTrainingDataAccessLogs[0-9A-F]+",
         "This bucket IS the checkpoint bucket's access-log destination "
         "(constructs_lib/log_buckets.py); logging its own deliveries would need yet "
         "another bucket, which would need its own."),
    Skip("CKV_AWS_18", r"AWS::S3::Bucket\.EmrClusterAccessLogs[0-9A-F]+",
         "This bucket IS the EMR log bucket's access-log destination "
         "(constructs_lib/log_buckets.py); logging its own deliveries would need yet "
         "another bucket, which would need its own."),
    Skip("CKV_AWS_18", r"AWS::S3::Bucket\.ClusterWorkdirStagingAccessLogs[0-9A-F]+",
         "This bucket IS the workdir staging bucket's access-log destination "
         "(constructs_lib/log_buckets.py, constructs_lib/workdir_staging.py); logging its "
         "own deliveries would need yet another bucket, which would need its own."),
)


def checkov_binary() -> Path | None:
    path = Path(os.environ.get("CHECKOV", DEFAULT_CHECKOV))
    return path if path.exists() else None


def failed_checks(template: dict, workdir: Path) -> list[tuple[str, str]]:
    """(check id, ``<type>.<logical id>``) of every check checkov fails on ``template``."""
    binary = checkov_binary()
    assert binary is not None, "checkov is not installed (make checkov-setup)"
    path = workdir / "template.json"
    path.write_text(json.dumps(template))
    proc = subprocess.run([str(binary), "-f", str(path), "--framework", "cloudformation",
                           "--quiet", "--compact", "-o", "json"], capture_output=True,
                          text=True, timeout=600, check=False)
    if proc.returncode not in (0, 1):  # 1: checks failed
        raise AssertionError(f"checkov exited {proc.returncode}: {proc.stderr[-2000:]}")
    reports = json.loads(proc.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    out = []
    for report in reports:
        assert report["summary"]["parsing_errors"] == 0, report["summary"]
        out += [(c["check_id"], c["resource"]) for c in report["results"]["failed_checks"]]
    return out
