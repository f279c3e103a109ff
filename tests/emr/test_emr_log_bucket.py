"""The EMR log bucket can be trusted afterwards: versioned (an overwritten or deleted log
stays recoverable), with S3 server access logs (who read or changed it) in a bucket of its
own, itself versioned, encrypted and retained."""

from __future__ import annotations

from tests.emr.conftest import Synth


def test_the_emr_log_bucket_is_versioned_with_access_logs(default_synth: Synth) -> None:
    synth = default_synth
    buckets = synth.template.find_resources("AWS::S3::Bucket")
    (log_id,) = [k for k in buckets if "LogBucket" in k]
    (access_id,) = [k for k in buckets if "AccessLogs" in k]
    props = buckets[log_id]["Properties"]
    assert props["VersioningConfiguration"] == {"Status": "Enabled"}
    assert props["LoggingConfiguration"] == {"DestinationBucketName": {"Ref": access_id},
                                             "LogFilePrefix": "log-bucket/"}
    access = buckets[access_id]["Properties"]
    assert access["VersioningConfiguration"] == {"Status": "Enabled"}
    assert access["BucketEncryption"]["ServerSideEncryptionConfiguration"][0][
        "ServerSideEncryptionByDefault"] == {"SSEAlgorithm": "AES256"}
    assert buckets[access_id]["DeletionPolicy"] == "Retain"
