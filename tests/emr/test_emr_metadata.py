"""bootstrap_scripts.emr against moto's EMR: the membership built from the cluster's own
instance list.

A cluster is created with ``run_job_flow`` on moto's server (1 primary g5.xlarge + 3 core
g5.12xlarge; moto gives them random 10.x addresses and answers DescribeInstanceTypes with
the real GPU counts), then every node's files are written as each node would write them.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import boto3
import pytest

from bootstrap_scripts.agent import node_files
from bootstrap_scripts.data import checksums
from bootstrap_scripts.emr import aws_cli, services
from bootstrap_scripts.emr import metadata as em
from bootstrap_scripts.jobs.cli.dl_run import build_parser as dl_run_parser
from bootstrap_scripts.jobs.cli.dl_run import split_command
from bootstrap_scripts.jobs.cli.request_args import request_from_args
from bootstrap_scripts.node import node_region
from bootstrap_scripts.protocol.membership import Membership, build_membership
from bootstrap_scripts.protocol.node_files import parse_env_file
from bootstrap_scripts.protocol.paths import NodePaths
from emulator import units
from tests.conftest import REGION, REPO_ROOT
from tests.support.emr import instances_of, make_cluster


def aws_cli_path() -> str:
    """The AWS CLI the dev requirements install next to this interpreter, else PATH's."""
    beside = Path(sys.executable).with_name("aws")
    found = str(beside) if beside.exists() else shutil.which("aws")
    assert found, "no AWS CLI: requirements-dev.txt pins awscli (run make setup)"
    return found


@pytest.fixture()
def clients(moto_reset: str):
    return (boto3.client("emr", region_name=REGION, endpoint_url=moto_reset),
            boto3.client("ec2", region_name=REGION, endpoint_url=moto_reset), moto_reset)


def test_every_node_writes_the_same_workers_file_primary_first_then_numeric(
        clients, tmp_path: Path) -> None:
    emr, ec2, endpoint = clients
    cluster_id = make_cluster(endpoint)
    primary, core = instances_of(endpoint, cluster_id)
    core_addresses = sorted((c["PrivateIpAddress"] for c in core), key=ipaddress.ip_address)
    expected_order = [primary["PrivateIpAddress"], *core_addresses]
    expected_workers = "".join(f"{a}\n" for a in expected_order)

    workers_files, memberships = set(), set()
    for node in [primary, *core]:
        root = tmp_path / node["Ec2InstanceId"]
        result = em.sync_once(emr, ec2, cluster_id=cluster_id,
                              instance_id=node["Ec2InstanceId"], root=str(root), efs_mount="/efs")
        assert result["status"] == "applied", result
        workers_files.add(NodePaths(root).workers.read_text())
        memberships.add(NodePaths(root).membership.read_text())
        # Re-running with an unchanged cluster touches nothing.
        again = em.sync_once(emr, ec2, cluster_id=cluster_id,
                             instance_id=node["Ec2InstanceId"], root=str(root), efs_mount="/efs")
        assert again["status"] == "unchanged"
    assert workers_files == {expected_workers}
    assert len(memberships) == 1  # byte-identical membership.json on every node


def test_env_has_the_deeplearning_variables_with_each_nodes_gpu_count(
        clients, tmp_path: Path) -> None:
    emr, ec2, endpoint = clients
    cluster_id = make_cluster(endpoint)
    primary, core = instances_of(endpoint, cluster_id)
    first_core = min(core, key=lambda c: ipaddress.ip_address(c["PrivateIpAddress"]))

    for node, gpus, rank in ((primary, "1", "0"), (first_core, "4", "1")):
        root = tmp_path / node["Ec2InstanceId"]
        em.sync_once(emr, ec2, cluster_id=cluster_id, instance_id=node["Ec2InstanceId"],
                     root=str(root), efs_mount="/efs")
        paths = NodePaths(root)
        env = parse_env_file(paths.env.read_text())
        assert env["DEEPLEARNING_WORKERS_COUNT"] == "4"
        assert env["DEEPLEARNING_WORKERS_PATH"] == str(paths.workers)
        assert env["DEEPLEARNING_WORKER_GPU_COUNT"] == gpus  # g5.xlarge 1, g5.12xlarge 4
        assert env["DEEPLEARNING_MASTER_ADDR"] == primary["PrivateIpAddress"]
        assert env["DEEPLEARNING_NODE_ADDR"] == node["PrivateIpAddress"]
        assert env["DEEPLEARNING_NODE_RANK"] == rank
        assert env["EFS_MOUNT"] == "/efs"
        # The same renderer as the EC2 node agent: the profile script exports the same env.
        profile = paths.profile.read_text()
        assert f"export DEEPLEARNING_WORKER_GPU_COUNT={gpus}\n" in profile
        hostfile = paths.hostfile.read_text().splitlines()
        assert hostfile[0] == f"{primary['PrivateIpAddress']} slots=1"
        assert all(line.endswith("slots=4") for line in hostfile[1:])
        m = Membership.load(paths.membership)
        assert m.cluster_id == cluster_id
        assert [n.instance_type for n in m.nodes] == ["g5.xlarge"] + ["g5.12xlarge"] * 3


def test_generation_grows_when_a_core_node_joins(clients, tmp_path: Path) -> None:
    """moto does not launch instances on resize, so the joining node is added to the list
    moto returned, in the two states EMR reports on the way in."""
    emr, ec2, endpoint = clients
    cluster_id = make_cluster(endpoint, core=2)
    listed = em.list_cluster_instances(emr, cluster_id)
    gpus = em.gpu_counts(ec2, [i["instance_type"] for i in listed])
    before = em.build_emr_membership(cluster_id, listed, gpus)
    joining = {"instance_id": "i-0000000000000feed", "address": "10.0.0.1",
               "instance_type": "g5.12xlarge", "group": "CORE"}
    booting = em.build_emr_membership(cluster_id, [*listed, {**joining, "state": "BOOTSTRAPPING"}],
                                      gpus)
    joined = em.build_emr_membership(cluster_id, [*listed, {**joining, "state": "RUNNING"}], gpus)
    assert booting.nodes == before.nodes  # not a member until it runs
    assert before.generation < booting.generation < joined.generation
    assert joined.nodes[1].address == "10.0.0.1"  # lowest address: first core node
    assert len(joined.nodes) == len(before.nodes) + 1
    # A node applying the newer generation rewrites its files; the older one is ignored.
    primary = before.master.instance_id
    assert node_files.apply_membership(tmp_path, joined, instance_id=primary).status == "applied"
    assert node_files.apply_membership(tmp_path, before, instance_id=primary).status == "older"


def test_nothing_is_written_before_the_cluster_is_up(clients, tmp_path: Path) -> None:
    emr, ec2, endpoint = clients
    cluster_id = make_cluster(endpoint, core=1)
    primary, _ = instances_of(endpoint, cluster_id)
    emr.terminate_job_flows(JobFlowIds=[cluster_id])
    result = em.sync_once(emr, ec2, cluster_id=cluster_id, instance_id=primary["Ec2InstanceId"],
                          root=str(tmp_path))
    assert result["status"] == "cluster-not-up"
    assert result["cluster_state"] in em.ENDED_STATES
    assert not NodePaths(tmp_path).workers.exists()


def test_generation_is_the_same_for_the_same_list_and_grows_with_every_transition() -> None:
    def inst(state: str) -> dict:
        return {"state": state}
    running = [inst("RUNNING")] * 3
    assert em.generation_of(running) == em.generation_of(list(running))
    steps = [[inst("PROVISIONING")], [inst("BOOTSTRAPPING")], [inst("RUNNING")],
             [inst("TERMINATED")]]
    gens = [em.generation_of(running + s) for s in steps]
    # provisioning -> bootstrapping keeps the node set (neither is a member) and the number.
    assert gens[0] == gens[1] < gens[2] < gens[3]


def test_sync_command_runs_as_its_own_process_against_moto(clients, tmp_path: Path) -> None:
    """The entry point a node runs (``python -m bootstrap_scripts.emr.metadata sync``)."""
    _, _, endpoint = clients
    cluster_id = make_cluster(endpoint, core=1)
    primary, core = instances_of(endpoint, cluster_id)
    info = tmp_path / "job-flow.json"
    info.write_text(json.dumps({"jobFlowId": cluster_id}))
    env = {**os.environ, "AWS_ENDPOINT_URL": endpoint, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "bootstrap_scripts.emr.metadata", "sync", "--job-flow-info",
         str(info), "--instance-id", core[0]["Ec2InstanceId"], "--root", str(tmp_path / "n"),
         "--region", REGION], env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["status"] == "applied"
    assert NodePaths(tmp_path / "n").workers.read_text() == (
        f"{primary['PrivateIpAddress']}\n{core[0]['PrivateIpAddress']}\n")


def test_cli_client_gives_the_same_membership_as_boto3(clients, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Nodes whose system Python lacks boto3 go through the AWS CLI instead."""
    emr, ec2, endpoint = clients
    cluster_id = make_cluster(endpoint, core=2)
    primary, _ = instances_of(endpoint, cluster_id)
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    aws = aws_cli_path()
    via_cli = em.sync_once(aws_cli.CliClient("emr", REGION, aws=aws),
                           aws_cli.CliClient("ec2", REGION, aws=aws),
                           cluster_id=cluster_id, instance_id=primary["Ec2InstanceId"],
                           root=str(tmp_path / "cli"))
    via_boto = em.sync_once(emr, ec2, cluster_id=cluster_id,
                            instance_id=primary["Ec2InstanceId"], root=str(tmp_path / "boto"))
    assert via_cli["status"] == via_boto["status"] == "applied"
    assert via_cli["nodes"] == via_boto["nodes"]
    cli, boto = NodePaths(tmp_path / "cli"), NodePaths(tmp_path / "boto")
    assert cli.workers.read_text() == boto.workers.read_text()
    assert cli.hostfile.read_text() == boto.hostfile.read_text()
    assert cli.membership.read_text() == boto.membership.read_text()


@pytest.fixture()
def failing_aws(tmp_path: Path) -> str:
    """An ``aws`` that fails every call the way the CLI does (exit 254, message on stderr)."""
    fake = tmp_path / "bin" / "aws"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'An error occurred (InvalidRequestException)' >&2\nexit 254\n")
    fake.chmod(0o755)
    return str(fake)


def test_cli_client_error_names_the_operation(failing_aws: str) -> None:
    client = aws_cli.CliClient("emr", REGION, aws=failing_aws)
    with pytest.raises(aws_cli.AwsCliError,
                       match=r"'aws emr list-instances' failed \(exit 254\)"):
        client.list_instances(ClusterId="j-NOPE")
    assert aws_cli.kebab("InstanceGroupTypes") == "instance-group-types"


def test_sync_command_reports_a_failing_aws_cli(failing_aws: str, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture) -> None:
    """Where boto3 is missing, a failed CLI call is one line naming the call, exit 1."""
    monkeypatch.setattr(aws_cli, "make_client",
                        lambda service, region: aws_cli.CliClient(service, region, failing_aws))
    code = em.main(["sync", "--cluster-id", "j-NOPE", "--instance-id", "i-1", "--root",
                    str(tmp_path / "n")])
    assert code == em.EXIT_FAILED
    assert "emr_metadata: 'aws emr describe-cluster' failed (exit 254)" in capsys.readouterr().err
    assert not NodePaths(tmp_path / "n").workers.exists()


def test_read_cluster_id_from_emr_job_flow_info(tmp_path: Path) -> None:
    info = tmp_path / "job-flow.json"
    info.write_text(json.dumps({"jobFlowId": "j-2AXXXXXXGAPLF", "jobFlowCreationInstant": 1}))
    assert em.read_cluster_id(str(info)) == "j-2AXXXXXXGAPLF"
    info.write_text("{}")
    with pytest.raises(em.MetadataError, match="no jobFlowId"):
        em.read_cluster_id(str(info))
    with pytest.raises(em.MetadataError, match="cannot read the cluster id"):
        em.read_cluster_id(str(tmp_path / "missing.json"))


def test_install_writes_dl_run_wrapper_and_units(tmp_path: Path) -> None:
    written = services.install_node_services(
        root=str(tmp_path), python="/opt/pytorch/bin/python", lib_dir="/opt/deeplearning/lib",
        efs_mount="/efs", watch_args=["--root", "/", "--efs-mount", "/efs"], region=REGION,
        systemctl=False)
    assert {p.name for p in written} == {"dl-run", services.WATCH_UNIT, services.EXECUTOR_UNIT,
                                         "data-checksums", "aws-region.env", "dl-aws-region.sh"}
    wrapper = tmp_path / "usr/local/bin/dl-run"
    assert os.access(wrapper, os.X_OK)
    text = wrapper.read_text()
    # Waits for the membership, then the ordinary runner with the user's arguments.
    assert "-m bootstrap_scripts.emr.metadata wait --root '/' || exit $?" in text
    # EMR runs no job controller: the runner runs the job itself (--unmanaged)
    assert text.rstrip().endswith(
        "-m bootstrap_scripts.jobs.cli.dl_run --unmanaged --root '/' \\\n"
        "  --mount-point '/efs' \"$@\"")
    unit = (tmp_path / "etc/systemd/system" / services.WATCH_UNIT).read_text()
    assert ('ExecStart="/opt/pytorch/bin/python" "-m" "bootstrap_scripts.emr.metadata" '
            '"watch" "--root" "/" "--efs-mount" "/efs"') in unit
    executor = (tmp_path / "etc/systemd/system" / services.EXECUTOR_UNIT).read_text()
    assert '"bootstrap_scripts.jobs.executor"' in executor and '"/efs"' in executor
    # Both units name the region file, which systemd requires to exist (no '-'): it is
    # there, under the node's root, with the stack's region (the stager reads it too).
    for text in (unit, executor):
        (env_file,) = [ln.split("=", 1)[1] for ln in text.splitlines()
                       if ln.startswith("EnvironmentFile=")]
        assert not env_file.startswith("-")
        env = units.environment_file(str(tmp_path / env_file.lstrip("/")), "unit")
        assert env["AWS_REGION"] == REGION and env["AWS_DEFAULT_REGION"] == REGION
    assert node_region.read_installed(tmp_path) == REGION


def dl_run_checksums(root: Path, *argv: str) -> str:
    """The ``--data-checksums`` of ``dl-run --root ROOT ARGV -- python train.py`` (the
    runner the EMR wrapper execs, with its own parser and rules)."""
    opts, command = split_command(["--root", str(root), *argv, "--", "python", "train.py"])
    return request_from_args(dl_run_parser().parse_args(opts), command, "j-1").data_checksums


def test_install_writes_the_clusters_data_checksums_where_dl_run_reads_them(
        tmp_path: Path) -> None:
    """The construct's ``data_checksums`` (``emrDataChecksums``) on an EMR node: a ``--data``
    step without ``--data-checksums`` takes it, an explicit flag wins; without the setting
    the node writes ``warn``, as the EC2 installer does; a mode the node does not know is
    refused (it would read it as ``warn``) and nothing is written."""
    kwargs = {"python": "/opt/pytorch/bin/python", "lib_dir": "/opt/deeplearning/lib",
              "efs_mount": "/efs", "watch_args": [], "region": REGION, "systemctl": False}
    node = tmp_path / "node"
    services.install_node_services(root=str(node), data_checksums="required", **kwargs)
    assert (node / checksums.SETTING_FILE).read_text() == "required\n"
    assert checksums.node_default(node) == checksums.REQUIRED
    assert dl_run_checksums(node, "--data", "s3://b-1/ds") == "required"
    assert dl_run_checksums(node, "--data", "s3://b-1/ds", "--data-checksums", "warn") == "warn"
    plain = tmp_path / "plain"
    services.install_node_services(root=str(plain), **kwargs)
    assert (plain / checksums.SETTING_FILE).read_text() == "warn\n"
    bad = tmp_path / "bad"
    with pytest.raises(ValueError, match=r"--data-checksums must be one of warn, required, "
                                         r"got 'strict'"):
        services.install_node_services(root=str(bad), data_checksums="strict", **kwargs)
    assert not bad.exists()


def test_wait_returns_once_the_membership_exists(tmp_path: Path) -> None:
    args = em.build_parser().parse_args(["wait", "--root", str(tmp_path), "--timeout", "0",
                                         "--poll", "0"])
    assert em.wait(args) == em.EXIT_TIMEOUT
    m = build_membership(cluster_id="j-1", generation=1,
                         master={"instance_id": "i-1", "address": "10.0.0.1"}, workers=[])
    node_files.apply_membership(tmp_path, m, instance_id="i-1")
    assert em.wait(args) == em.EXIT_OK


def test_bootstrap_action_unpacks_the_scripts_and_installs(tmp_path: Path) -> None:
    """The bootstrap action as EMR runs it: metadata.py downloaded alone, outside any package
    (cwd is a temp dir and the repo is not on sys.path), with ``aws s3 cp`` faked. Its
    installer part comes from the node scripts it unpacks."""
    import zipfile

    archive = tmp_path / "node-scripts.zip"
    package = Path(REPO_ROOT) / "bootstrap_scripts"
    with zipfile.ZipFile(archive, "w") as zf:
        for path in package.rglob("*.py"):
            zf.write(path, path.relative_to(package))
    bindir = tmp_path / "bin"
    bindir.mkdir()
    aws = bindir / "aws"
    aws.write_text(f"#!/bin/sh\necho \"$*\" >> {tmp_path}/aws.calls\n"
                   f"[ \"$1 $2\" = \"s3 cp\" ] && cp {archive} \"$5\"\n")
    aws.chmod(0o755)
    downloaded = tmp_path / "bootstrap-actions" / "2" / "metadata.py"
    downloaded.parent.mkdir(parents=True)
    shutil.copy(package / "emr" / "metadata.py", downloaded)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    root, lib = tmp_path / "root", tmp_path / "lib"
    proc = subprocess.run(
        [sys.executable, str(downloaded), "bootstrap", "--scripts-url",
         "s3://assets/abc.zip", "--region", REGION, "--efs-mount", "/efs", "--python",
         sys.executable, "--lib-dir", str(lib), "--root", str(root), "--no-sudo",
         "--no-systemctl", "--data-checksums", "required"],
        env={**env, "PATH": f"{bindir}:{os.environ['PATH']}"}, cwd=tmp_path,
        capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "aws.calls").read_text().startswith(
        f"s3 cp --only-show-errors s3://assets/abc.zip {lib}/node-scripts.zip --region {REGION}")
    assert (lib / "bootstrap_scripts" / "emr" / "services.py").is_file()
    assert os.access(root / "usr/local/bin/dl-run", os.X_OK)
    unit = (root / "etc/systemd/system" / services.WATCH_UNIT).read_text()
    assert f'"PYTHONPATH={lib}"' in unit and '"--region" "us-east-1"' in unit
    assert checksums.node_default(root) == checksums.REQUIRED  # the construct's setting
    assert node_region.read_installed(root) == REGION  # the stack's, for units and stager
