"""The emulator's CloudWatch agent (emulator/cloudwatch_agent.py) ships the files of the
configuration the node installer wrote to moto's CloudWatch Logs over HTTP, and
``dlc logs --source cloudwatch`` reads a job's lines back from there, with the node prefix
``dlc logs`` prints from EFS, one node or every node."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import boto3
import pytest

from bootstrap_scripts.agent import cloudwatch_config
from bootstrap_scripts.jobs.executor.log_mirror import JOBS_LOG, LogMirror, share_sources
from dlc import cloudwatch
from dlc.cli import main
from emulator.cloudwatch_agent import Shipper
from emulator.deploy import REGION, REPO_ROOT

GROUP = "/deeplearning/c1"


@pytest.fixture()
def logs(moto_reset):
    client = boto3.client("logs", endpoint_url=moto_reset, region_name=REGION)
    client.create_log_group(logGroupName=GROUP)
    return client


def node(tmp_path, instance: str, *, master: bool = False):
    """A node's root with the installer's configuration for ``instance``."""
    root = tmp_path / instance
    config = root / cloudwatch_config.CONFIG_PATH
    config.parent.mkdir(parents=True)
    config.write_text(cloudwatch_config.render(root=root, log_group=GROUP,
                                               instance_id=instance, master=master))
    (root / cloudwatch_config.LOG_DIR).mkdir(parents=True)
    return root, config


def stream(logs, name: str) -> list[str]:
    return [e["message"] for e in logs.get_log_events(
        logGroupName=GROUP, logStreamName=name, startFromHead=True)["events"]]


def test_new_whole_lines_go_to_their_stream_once_and_a_truncated_file_starts_over(
        tmp_path, logs) -> None:
    root, config = node(tmp_path, "i-0aaa")
    agent_log = cloudwatch_config.unit_log(root, "agent")
    agent_log.write_text("joined gen=1\nhalf")
    shipper = Shipper(logs, cloudwatch_config.collected(config.read_text()), tmp_path / "st")
    assert shipper.ship_once() == 1
    assert shipper.ship_once() == 0  # nothing new: nothing sent twice
    with open(agent_log, "a") as f:
        f.write(" a line\n")
    assert shipper.ship_once() == 1
    agent_log.write_text("rotated\n")  # logrotate's copytruncate
    assert shipper.ship_once() == 1
    assert stream(logs, "i-0aaa/agent") == ["joined gen=1", "half a line", "rotated"]


def test_the_agent_process_ships_with_the_nodes_environment(tmp_path, logs,
                                                             moto_reset) -> None:
    root, config = node(tmp_path, "i-0bbb")
    cloudwatch_config.unit_log(root, "executor").write_text("executor for 10.0.0.5\n")
    env = {**os.environ, "AWS_ENDPOINT_URL": moto_reset, "PYTHONPATH": str(REPO_ROOT)}
    res = subprocess.run([sys.executable, "-m", "emulator.cloudwatch_agent", "--config",
                          str(config), "--state-dir", str(tmp_path / "st"), "--once"],
                         cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert stream(logs, "i-0bbb/executor") == ["executor for 10.0.0.5"]


def test_dlc_logs_source_cloudwatch_reads_a_job_back(tmp_path, logs, moto_reset,
                                                     capsys) -> None:
    # two nodes ran job j7 (attempts 1 and 2) and another job; each executor copied its
    # share's output to its jobs log, each node's agent shipped it
    efs = tmp_path / "efs"
    for instance, rank, address in (("i-0m", 0, "10.0.0.4"), ("i-0w", 1, "10.0.0.5")):
        root, config = node(tmp_path, instance)
        mirror = LogMirror(root)
        # the executor prefixes each line with the attempt's key, <user>/<attempt id>
        for job, text in (("alice/j7.1", f"try1 rank{rank}\n"),
                          ("alice/j7.2", f"epoch=1 rank{rank}\n"),
                          ("alice/other.1", "not this job\n")):
            nodes = efs / "jobs" / job / "nodes"
            nodes.mkdir(parents=True, exist_ok=True)
            (nodes / f"{rank}.log").write_text(text)
            mirror.follow(share_sources(job, nodes, address, [(rank, "", f"{rank}.log")]))
            mirror.follow([])
        Shipper(logs, cloudwatch_config.collected(config.read_text()),
                tmp_path / instance / "st").ship_once()
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"aws": {"endpoint": moto_reset, "region": REGION,
                                         "access_key_id": "testing",
                                         "secret_access_key": "testing"}}))
    code = main(["--emulator", str(state), "--stack", "c1", "logs", "j7", "--source",
                 "cloudwatch"])
    out = capsys.readouterr().out
    assert code == 0
    assert sorted(out.splitlines()) == sorted([
        "[0 10.0.0.4] try1 rank0", "[0 10.0.0.4] epoch=1 rank0",
        "[1 10.0.0.5] try1 rank1", "[1 10.0.0.5] epoch=1 rank1"])
    code = main(["--emulator", str(state), "--stack", "c1", "logs", "j7", "--source",
                 "cloudwatch", "--node", "1"])
    assert sorted(capsys.readouterr().out.splitlines()) == [
        "[1 10.0.0.5] epoch=1 rank1", "[1 10.0.0.5] try1 rank1"]


def test_job_line_picks_the_job_and_its_attempts_only() -> None:
    assert cloudwatch.job_line("j7.3 [0 10.0.0.4] x", "j7", None) == "[0 10.0.0.4] x"
    assert cloudwatch.job_line("j7 [0 10.0.0.4] x", "j7", 0) == "[0 10.0.0.4] x"
    assert cloudwatch.job_line("j7 [0 10.0.0.4] x", "j7", 1) is None
    assert cloudwatch.job_line("j70.1 [0 10.0.0.4] x", "j7", None) is None
    assert cloudwatch.job_line("j7.x [0 a] x", "j7", None) is None
    # the executors' lines carry the job's key, <user>/<attempt id>
    assert cloudwatch.job_line("alice/j7.3 [0 10.0.0.4] x", "j7", None) == "[0 10.0.0.4] x"
    assert cloudwatch.job_line("alice/j7.3 [0 10.0.0.4] x", "alice/j7", 0) == "[0 10.0.0.4] x"
    assert cloudwatch.job_line("alice/j7.3 [0 10.0.0.4] x", "bob/j7", None) is None
    assert cloudwatch.job_line("alice/j70.1 [0 10.0.0.4] x", "j7", None) is None


def test_dashboard_url_per_partition() -> None:
    assert cloudwatch.dashboard_url("eu-west-1", "c1-cluster") == (
        "https://eu-west-1.console.aws.amazon.com/cloudwatch/home?region=eu-west-1"
        "#dashboards/dashboard/c1-cluster")
    assert cloudwatch.dashboard_url("cn-north-1", "d").startswith(
        "https://console.amazonaws.cn/")


def test_dlc_logs_falls_back_to_cloudwatch_when_the_master_cannot_answer(
        tmp_path, logs, moto_reset, capsys) -> None:
    """No stack, no master (the cluster is unreachable): ``dlc logs`` says so and reads the
    log group by its name; ``--source efs`` keeps the master's error."""
    root, config = node(tmp_path, "i-0m")
    (root / JOBS_LOG).write_text("j9.1 [0 10.0.0.4] still here\n")
    Shipper(logs, cloudwatch_config.collected(config.read_text()), tmp_path / "st").ship_once()
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"aws": {"endpoint": moto_reset, "region": REGION,
                                         "access_key_id": "testing",
                                         "secret_access_key": "testing"}}))
    code = main(["--emulator", str(state), "--stack", "c1", "logs", "j9"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert captured.out == "[0 10.0.0.4] still here\n"
    assert "stack c1 not found" in captured.err and "CloudWatch log group instead" in captured.err
    code = main(["--emulator", str(state), "--stack", "c1", "logs", "j9", "--source", "efs"])
    captured = capsys.readouterr()
    assert code == 3 and captured.out == "" and "stack c1 not found" in captured.err


def test_an_emf_line_is_shipped_to_the_metrics_stream_and_becomes_a_metric(
        tmp_path, logs, moto_reset) -> None:
    from bootstrap_scripts.jobs.executor.gpu_sampler import sample_line
    from bootstrap_scripts.metrics import metrics_emf
    from bootstrap_scripts.metrics.gpu_metrics import parse

    root, config = node(tmp_path, "i-0aaa")
    line = sample_line(parse("0, 80, 100, 60, 200.00, 0, No\n1, 40, 100, 50, 100.00, 0, No"),
                       "c1", "i-0aaa", int(time.time() * 1000))
    metrics_emf.append(metrics_emf.metrics_log(root), [line, "not an EMF line"])
    cw = boto3.client("cloudwatch", endpoint_url=moto_reset, region_name=REGION)
    shipper = Shipper(logs, cloudwatch_config.collected(config.read_text()), tmp_path / "st",
                      metrics=cw)
    assert shipper.ship_once() == 2
    assert stream(logs, "i-0aaa/metrics") == [line, "not an EMF line"]
    stats = {}
    for dims in ([("ClusterId", "c1"), ("InstanceId", "i-0aaa")], [("ClusterId", "c1")]):
        got = cw.get_metric_statistics(
            Namespace="DeepLearningCluster", MetricName="GPUUtilization",
            Dimensions=[{"Name": k, "Value": v} for k, v in dims],
            StartTime=time.time() - 600, EndTime=time.time() + 600, Period=60,
            Statistics=["Average"])["Datapoints"]
        stats[len(dims)] = [(p["Average"], p["Unit"]) for p in got]
    assert stats == {2: [(60.0, "Percent")], 1: [(60.0, "Percent")]}
    names = {m["MetricName"] for m in cw.list_metrics(Namespace="DeepLearningCluster")["Metrics"]}
    assert {"GPUMemoryUsed", "GPUTemperature", "GPUPowerDraw"} <= names
