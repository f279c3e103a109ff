"""``dlc up``'s checks against the account (dlc/preflight.py), on moto's server: each refusal
names the context key, the value and the limit, and nothing is deployed."""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest

from dlc import preflight
from dlc.cli import main
from dlc.errors import DlcError, UsageError
from dlc.target import resolve
from emulator import deploy as dp


@pytest.fixture()
def account(moto_reset: str, tmp_path: Path) -> tuple[str, Path, str]:
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"endpoint": moto_reset, "aws": {
        "endpoint": moto_reset, "region": "us-east-1", "access_key_id": "testing",
        "secret_access_key": "testing", "session_token": "testing"}}))
    ec2 = boto3.client("ec2", endpoint_url=moto_reset, region_name="us-east-1")
    return moto_reset, state, dp.pick_ami(ec2)


def check(state: Path, *contexts: str) -> list[str]:
    lines: list[str] = []
    preflight.check(resolve(emulator=str(state), environ={}), list(contexts), lines.append)
    return lines


def raise_quota(endpoint: str, code: str, vcpus: float) -> None:
    """What an operator does before a first GPU cluster: ask Service Quotas for more."""
    answer = boto3.client("service-quotas", endpoint_url=endpoint, region_name="us-east-1") \
        .request_service_quota_increase(ServiceCode="ec2", QuotaCode=code, DesiredValue=vcpus)
    assert answer["RequestedQuota"]["QuotaCode"] == code


def test_settings_the_account_has_pass(account) -> None:
    endpoint, state, ami = account
    boto3.client("ec2", endpoint_url=endpoint, region_name="us-east-1").create_key_pair(
        KeyName="ops")
    raise_quota(endpoint, "L-417A185B", 2 * 192)  # two p5.48xlarge workers
    raise_quota(endpoint, "L-DB2E81BA", 4)  # the g5.xlarge master
    lines = check(state, f"amiId={ami}", "keyName=ops", "workerInstanceTypes=p5.48xlarge,"
                  "p4d.24xlarge", "workerCount=2")
    assert lines[-1] == ("checked against us-east-1: instance types offered, key pair exists, "
                         "image exists, vCPU quotas")
    assert not [x for x in lines if "skipped" in x], lines


def test_a_new_account_has_no_gpu_quota(account) -> None:
    """A new account's Service Quotas say 0 vCPUs of G and P instances: the default cluster
    (three g5.xlarge, 4 vCPUs each) is refused with the keys, the need and the limit."""
    endpoint, state, ami = account
    quotas = boto3.client("service-quotas", endpoint_url=endpoint, region_name="us-east-1")
    defaults = {q["QuotaCode"]: q["Value"] for q in quotas.list_aws_default_service_quotas(
        ServiceCode="ec2")["Quotas"]}
    assert defaults["L-DB2E81BA"] == 0 and defaults["L-417A185B"] == 0
    assert defaults["L-1216C47A"] == 5
    with pytest.raises(DlcError) as err:
        check(state, f"amiId={ami}")
    assert ("context keys 'masterInstanceType', 'workerInstanceType': the nodes need 12 vCPUs "
            "of 'Running On-Demand G and VT instances' (L-DB2E81BA), the quota in us-east-1 "
            "is 0") in str(err.value)
    with pytest.raises(DlcError, match=r"the nodes need 4 vCPUs of 'Spot G and VT instances' "
                       r"\(L-3819A6DF\), the quota in us-east-1 is 0"):
        raise_quota(endpoint, "L-DB2E81BA", 12)
        check(state, f"amiId={ami}", "spotWorkers=1")
    raise_quota(endpoint, "L-3819A6DF", 4)
    assert check(state, f"amiId={ami}", "spotWorkers=1")[-1].endswith("vCPU quotas")


def test_every_refusal_names_key_value_and_limit(account) -> None:
    _endpoint, state, _ami = account
    with pytest.raises(DlcError) as err:
        check(state, "workerInstanceType=g5.96xlarge", "keyName=nobody",
              "amiId=ami-0123456789abcdef0")
    text = str(err.value)
    assert "nothing was deployed" in text
    assert ("context key 'workerInstanceType': g5.96xlarge is not offered in us-east-1 "
            "(EC2 DescribeInstanceTypeOfferings)") in text
    assert "context key 'keyName': key pair 'nobody' does not exist in us-east-1" in text
    assert "context key 'amiId': image ami-0123456789abcdef0 does not exist in us-east-1" in text


def test_an_unpublished_dlami_parameter_is_refused(account) -> None:
    _endpoint, state, _ami = account
    with pytest.raises(DlcError) as err:
        check(state, "pytorchVersion=2.6")
    assert ("the DLAMI parameter /aws/service/deeplearning/ami/x86_64/oss-nvidia-driver-gpu-"
            "pytorch-2.6-amazon-linux-2023/latest/ami-id is not published in us-east-1") \
        in str(err.value)
    assert "'pytorchVersion'='2.6'" in str(err.value)


def test_bad_and_misspelt_keys_are_refused_before_any_call(account) -> None:
    _endpoint, state, _ami = account
    with pytest.raises(UsageError, match="did you mean 'workerCount'"):
        check(state, "workercount=3")
    with pytest.raises(UsageError, match="'workerCount' must be at most 1000"):
        check(state, "workerCount=100000")


def test_dlc_up_refuses_without_deploying(account, capsys) -> None:
    endpoint, state, ami = account
    code = main(["--emulator", str(state), "up", "--no-wait", "-c", f"amiId={ami}",
                 "-c", "masterInstanceType=p5.96xlarge"])
    assert code == 1
    assert "context key 'masterInstanceType': p5.96xlarge is not offered" in \
        capsys.readouterr().err
    cfn = boto3.client("cloudformation", endpoint_url=endpoint, region_name="us-east-1")
    assert cfn.list_stacks()["StackSummaries"] == []


def test_vcpus_per_quota() -> None:
    """The master and the On-Demand workers add up per quota; Spot workers count against the
    Spot quota; the quota is compared with the total, naming the keys that ask for it."""
    from constructs_lib.cluster_settings import ClusterSettings

    s = ClusterSettings(worker_count=3, spot_workers=2, master_instance_type="g5.xlarge",
                        worker_instance_type="p5.48xlarge")
    needs, unknown = preflight.vcpu_needs(s, {"g5.xlarge": 4, "p5.48xlarge": 192})
    assert unknown == []
    by_code = {n.code: n for n in needs}
    assert by_code["L-DB2E81BA"].vcpus == 4 and by_code["L-DB2E81BA"].keys == (
        "masterInstanceType",)
    assert by_code["L-417A185B"].vcpus == 3 * 192
    assert by_code["L-7212CCBC"].vcpus == 2 * 192
    assert preflight.quota_class("trn1n.32xlarge").on_demand == "L-2C3B7624"
    assert preflight.quota_class("u-6tb1.metal") is None


def test_efa_needs_types_with_efa(account) -> None:
    """With efa=true each type must support EFA (DescribeInstanceTypes), and have the EFA
    network cards the stack gives interfaces."""
    endpoint, state, ami = account
    raise_quota(endpoint, "L-DB2E81BA", 12)
    with pytest.raises(DlcError) as err:
        check(state, f"amiId={ami}", "efa=true")
    assert ("context keys 'efa'=true / 'masterInstanceType': g5.xlarge does not support EFA "
            "(EC2 DescribeInstanceTypes NetworkInfo.EfaSupported)") in str(err.value)
    raise_quota(endpoint, "L-417A185B", 3 * 192)
    lines = check(state, f"amiId={ami}", "efa=true", "workerInstanceType=p5.48xlarge",
                  "masterInstanceType=p5.48xlarge")
    assert lines[-1].endswith("vCPU quotas")


def test_a_stale_efa_table_is_caught_before_the_deploy(account, monkeypatch) -> None:
    from constructs_lib import efa

    endpoint, state, ami = account
    raise_quota(endpoint, "L-417A185B", 3 * 192)
    monkeypatch.setitem(efa.EFA_CARDS, "p5.48xlarge", (0, 4))
    with pytest.raises(DlcError, match=r"the stack gives p5.48xlarge 4 EFA interface\(s\), EC2 "
                       r"DescribeInstanceTypes says its EFA network cards are \[0, 1, 2"):
        check(state, f"amiId={ami}", "efa=true", "workerInstanceType=p5.48xlarge",
              "masterInstanceType=p5.48xlarge")
