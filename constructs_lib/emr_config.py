"""EMR-specific parts of EmrDeepLearningCluster that need no construct: prop checks
(release label, applications, S3 URLs, the training command) and the documents the cluster
carries (security configuration, deploy-time step)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from aws_cdk import aws_emr as emr

from bootstrap_scripts.emr.submit import dl_run_step
from constructs_lib.validation import ConfigError

#: Applications offered by EMR 7.x releases (canonical spelling; matching is case-blind).
EMR7_APPLICATIONS: tuple[str, ...] = (
    "AmazonCloudWatchAgent", "Delta", "Flink", "HBase", "HCatalog", "Hadoop", "Hive", "Hudi",
    "Hue", "Iceberg", "JupyterEnterpriseGateway", "JupyterHub", "Livy", "Oozie", "Phoenix",
    "Pig", "Presto", "Spark", "TensorFlow", "Tez", "Trino", "Zeppelin", "ZooKeeper",
)
#: Applications that made the original's cluster fail to start, and why.
UNSTABLE_APPLICATIONS: dict[str, str] = {
    "Hue": ("Hue failed to start on the Deep Learning AMI (its service expects the stock EMR "
            "AMI's Python and database packages), which failed the whole cluster start"),
    "Zeppelin": ("Zeppelin failed to start on the Deep Learning AMI (its interpreter setup "
                 "collides with the AMI's Python/conda environments), which failed the whole "
                 "cluster start"),
}

_RELEASE_LABEL = re.compile(r"^emr-(\d+)\.(\d+)\.(\d+)$")
_S3_URL = re.compile(r"^s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])/(.+)$")


def release_label(value: str) -> str:
    match = _RELEASE_LABEL.match(str(value))
    if not match:
        raise ConfigError(f"release_label must look like emr-7.12.0, got {value!r}")
    if int(match.group(1)) < 7:
        raise ConfigError(
            "release_label must be an emr-7.x release or later (the construct uses an "
            f"Amazon Linux 2023 Deep Learning AMI, which EMR supports from 7.0), got {value!r}")
    return str(value)


def applications(names: Sequence[str], *, allow_unstable: bool) -> list[str]:
    """Canonical application names; unknown names and (unless allowed) Hue/Zeppelin refused."""
    if isinstance(names, str):
        raise ConfigError(f"applications must be a list of names, got the string {names!r}")
    known = {a.lower(): a for a in EMR7_APPLICATIONS}
    result: list[str] = []
    for raw in names:
        name = known.get(str(raw).strip().lower())
        if name is None:
            raise ConfigError(
                f"applications contains {raw!r}, which is not an EMR 7 application; "
                f"expected some of: {', '.join(EMR7_APPLICATIONS)}")
        if name in UNSTABLE_APPLICATIONS and not allow_unstable:
            raise ConfigError(
                f"applications contains {name!r}: {UNSTABLE_APPLICATIONS[name]}. Leave it "
                "out, or pass allow_unstable_applications=True (context "
                "emrAllowUnstableApplications=true) if you have checked it starts on your AMI")
        if name not in result:
            result.append(name)
    return result


def s3_object_url(name: str, value: str) -> tuple[str, str]:
    """``s3://bucket/key`` as (bucket, key)."""
    match = _S3_URL.match(str(value))
    if not match:
        raise ConfigError(
            f"{name} must be an S3 object URL like s3://my-bucket/certs/emr-tls.zip, "
            f"got {value!r}")
    return match.group(1), match.group(2)


def training_command(value: Sequence[str] | None) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str) or not list(value):
        raise ConfigError(
            "training_command must be a non-empty list of arguments such as "
            f"['python', 'train.py'], got {value!r}")
    return [str(word) for word in value]


def security_configuration(*, local_disk_key_arn: str, tls_certificates_s3_url: str | None) -> dict:
    """At-rest encryption (SSE-S3 for EMRFS, KMS for local disks and EBS), in-transit
    encryption with the user's PEM certificates if given, IMDSv2 required."""
    encryption: dict = {
        "EnableAtRestEncryption": True,
        "AtRestEncryptionConfiguration": {
            "S3EncryptionConfiguration": {"EncryptionMode": "SSE-S3"},
            "LocalDiskEncryptionConfiguration": {
                "EncryptionKeyProviderType": "AwsKms",
                "AwsKmsKey": local_disk_key_arn,
                "EnableEbsEncryption": True,
            },
        },
        "EnableInTransitEncryption": tls_certificates_s3_url is not None,
    }
    if tls_certificates_s3_url:
        encryption["InTransitEncryptionConfiguration"] = {
            "TLSCertificateConfiguration": {
                "CertificateProviderType": "PEM", "S3Object": tls_certificates_s3_url}}
    return {
        "EncryptionConfiguration": encryption,
        "InstanceMetadataServiceConfiguration": {
            "MinimumInstanceMetadataServiceVersion": 2,
            "HttpPutResponseHopLimit": 2,
        },
    }


def deploy_time_steps(command: list[str] | None) -> list[emr.CfnCluster.StepConfigProperty] | None:
    """The ``dl-run`` step that runs ``command`` once the cluster is up, if any."""
    if command is None:
        return None
    spec = dl_run_step(command, name="dl-run (deploy-time training)")
    jar = spec["HadoopJarStep"]
    return [emr.CfnCluster.StepConfigProperty(
        name=spec["Name"], action_on_failure=spec["ActionOnFailure"],
        hadoop_jar_step=emr.CfnCluster.HadoopJarStepConfigProperty(
            jar=jar["Jar"], args=jar["Args"]))]
