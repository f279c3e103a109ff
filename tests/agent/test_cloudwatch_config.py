"""The CloudWatch agent's configuration a node writes (bootstrap_scripts/agent/cloudwatch_config.py)
and the installer's part: the agent's JSON format, one stream per node and source, the
units appending where the configuration reads, nothing written without a log group."""

from __future__ import annotations

import json

import pytest

from bootstrap_scripts.agent import cloudwatch_config, install
from bootstrap_scripts.jobs.executor import log_mirror
from bootstrap_scripts.metrics import metric_names as names
from bootstrap_scripts.metrics import metrics_emf
from emulator.units import unit_output


def test_render_is_the_agents_json_format_one_stream_per_node_and_source(tmp_path) -> None:
    text = cloudwatch_config.render(root=tmp_path, log_group="/deeplearning/c1",
                                    instance_id="i-0abc", master=True)
    config = json.loads(text)
    assert config["agent"] == {"run_as_user": "root"}
    assert config["logs"]["force_flush_interval"] == cloudwatch_config.FLUSH_SECONDS
    entries = config["logs"]["logs_collected"]["files"]["collect_list"]
    assert entries == cloudwatch_config.collected(text)
    by_stream = {e["log_stream_name"]: e for e in entries}
    assert sorted(by_stream) == sorted(f"i-0abc/{s}" for s in names.LOG_SOURCES)
    for e in entries:
        assert set(e) == {"file_path", "log_group_name", "log_stream_name", "timezone"}
        assert e["log_group_name"] == "/deeplearning/c1" and e["timezone"] == "UTC"
    assert by_stream["i-0abc/agent"]["file_path"] == str(tmp_path / "var/log/dl-cluster/agent.log")
    assert by_stream["i-0abc/bootstrap"]["file_path"] == str(tmp_path / "var/log/dl-bootstrap.log")
    # the executor's copy of the jobs' output is the file the configuration reads
    assert by_stream["i-0abc/jobs"]["file_path"] == str(log_mirror.jobs_log(tmp_path))
    # the metrics' EMF lines go to their own stream, from the file they are appended to
    assert by_stream["i-0abc/metrics"]["file_path"] == str(metrics_emf.metrics_log(tmp_path))


def test_a_worker_ships_no_controller_log(tmp_path) -> None:
    entries = cloudwatch_config.collected(cloudwatch_config.render(
        root="/", log_group="g", instance_id="i-1", master=False))
    assert "i-1/controller" not in {e["log_stream_name"] for e in entries}


@pytest.mark.parametrize("group,instance", [("", "i-1"), ("g" * 513, "i-1"), ("g", ""),
                                            ("g", "i-1/x"), ("g", "{instance_id}")])
def test_bad_arguments_are_refused(group, instance) -> None:
    with pytest.raises(cloudwatch_config.ConfigError):
        cloudwatch_config.render(root="/", log_group=group, instance_id=instance, master=False)


def test_collected_refuses_a_file_without_a_collect_list() -> None:
    with pytest.raises(ValueError, match="collect_list"):
        cloudwatch_config.collected('{"logs": {}}')


def agent_args(root, role: str = "master") -> list[str]:
    return ["--role", role, "--cluster-id", "c1", "--stack-name", "c1", "--region",
            "us-east-1", "--master-queue-url", "https://sqs/q", "--efs-id", "fs-0123abcd",
            "--mount-point", "/efs", "--wait-handle", "", "--setup-timeout", "3300",
            "--root", str(root), "--no-systemctl", "--python", "/usr/bin/python3",
            "--package-dir", "/opt/dl"]


def test_installer_writes_the_configuration_and_units_append_where_it_reads(
        tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(install, "this_instance_id", lambda **_: "i-0feed")
    written = install.install([*agent_args(tmp_path), "--log-group", "/deeplearning/c1"])
    config_path = tmp_path / cloudwatch_config.CONFIG_PATH
    assert config_path in written
    files = {e["log_stream_name"]: e["file_path"]
             for e in cloudwatch_config.collected(config_path.read_text())}
    for source, unit in (("agent", "dl-agent"), ("executor", "dl-executor"),
                         ("controller", "dl-controller")):
        text = (tmp_path / f"etc/systemd/system/{unit}.service").read_text()
        assert unit_output(text) == files[f"i-0feed/{source}"]
        assert "StandardError=inherit" in text
    assert (tmp_path / cloudwatch_config.LOG_DIR).is_dir()
    rotate = (tmp_path / install.LOGROTATE_FILE).read_text()
    assert "copytruncate" in rotate and str(tmp_path / cloudwatch_config.LOG_DIR) in rotate


def test_no_log_group_no_configuration(tmp_path) -> None:
    install.install(agent_args(tmp_path, "worker"))
    assert not (tmp_path / cloudwatch_config.CONFIG_PATH).exists()


def test_a_missing_agent_is_reported_not_fatal(tmp_path, capsys) -> None:
    assert install.start_cloudwatch_agent(tmp_path, tmp_path / "c.json") is False
    assert "no CloudWatch agent" in capsys.readouterr().err


def test_the_agent_is_started_on_the_written_file(tmp_path) -> None:
    ctl = tmp_path / cloudwatch_config.CTL_PATH
    ctl.parent.mkdir(parents=True)
    ctl.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/argv\n")
    ctl.chmod(0o755)
    assert install.start_cloudwatch_agent(tmp_path, tmp_path / "c.json") is True
    assert (tmp_path / "argv").read_text().split() == [
        "-a", "fetch-config", "-m", "ec2", "-s", "-c", f"file:{tmp_path}/c.json"]
