"""The CloudWatch agent's configuration on a node: which files go to which log stream.

The node installer (``bootstrap_scripts.agent.install``) writes it to
:data:`CONFIG_PATH` under the node's root and starts the agent on it with
``amazon-cloudwatch-agent-ctl -a fetch-config -m ec2 -s -c file:<path>``, as AWS documents
for a configuration file written by hand
(https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/CloudWatch-Agent-Configuration-File-Details.html,
https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/install-CloudWatch-Agent-commandline-fileoverview.html).
The file is the agent's own JSON format: ``agent`` (``run_as_user``), ``logs`` with
``logs_collected.files.collect_list`` (one entry per file: ``file_path``,
``log_group_name``, ``log_stream_name``, ``timezone``) and ``force_flush_interval``.

Every node ships its own files to the cluster's one log group, each to the stream
``<instance-id>/<source>`` (``bootstrap_scripts.metrics.metric_names``): the node agent's, the job
executor's and (the master's) the job controller's output as their systemd units append it
(:data:`LOG_DIR`), the user data's boot log, and the jobs' output this node ran. The
Metrics travel the same way: the executor and (the master's) controller append CloudWatch
embedded metric format lines (``bootstrap_scripts.metrics.metrics_emf``) to
``<LOG_DIR>/metrics.log``,
shipped to ``<instance-id>/metrics`` like any file; CloudWatch Logs extracts the metrics
from such events itself, with or without the ``x-amzn-logs-format: json/emf`` header
(https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/CloudWatch_Embedded_Metric_Format_Generation_PutLogEvents.html).
No ``logs.metrics_collected.emf`` section: that one makes the agent listen on a TCP/UDP
port (25888) for EMF events sent by programs
(https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/CloudWatch_Embedded_Metric_Format_Generation_CloudWatch_Agent.html),
a socket any local user could write fake metrics to; a root-owned file needs none. The
instance id is written in, not left to the agent's ``{instance_id}`` placeholder, so the
stream names are what ``dlc logs --source cloudwatch`` looks for whoever reads them. The
log group itself (its KMS key, its retention) is the stack's: the node role may create
streams and put events in that group only, so no ``retention_in_days`` here (setting it
would need ``logs:PutRetentionPolicy``).

Pure: no AWS call, no file written (the installer writes what :func:`render` returns).
"""

from __future__ import annotations

import json
from pathlib import Path

from bootstrap_scripts.metrics.metric_names import (
    SOURCE_AGENT,
    SOURCE_BOOTSTRAP,
    SOURCE_CONTROLLER,
    SOURCE_EXECUTOR,
    SOURCE_JOBS,
    SOURCE_METRICS,
    log_stream,
)

#: Where the installer writes the configuration (relative to the node's root): the path
#: AWS recommends for a configuration file written by hand.
CONFIG_PATH = "opt/aws/amazon-cloudwatch-agent/etc/amazon-cloudwatch-agent.json"
#: The agent's control script, installed by its package.
CTL_PATH = "opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl"
#: Where the cluster's units append their output (relative to the node's root).
LOG_DIR = "var/log/dl-cluster"
#: The user data's own log (``constructs_lib.user_data.BOOTSTRAP_LOG``, relative to root).
BOOTSTRAP_LOG = "var/log/dl-bootstrap.log"
#: Seconds between the agent's uploads of collected lines (the agent's default is 5).
FLUSH_SECONDS = 5
#: The daemons whose units append to ``<LOG_DIR>/<source>.log``.
UNIT_SOURCES = (SOURCE_AGENT, SOURCE_EXECUTOR, SOURCE_CONTROLLER)


class ConfigError(ValueError):
    """The arguments cannot make a valid configuration (the message names which)."""


def unit_log(root: str | Path, source: str) -> Path:
    """The file a unit's output is appended to (``StandardOutput=append:``)."""
    return Path(root) / LOG_DIR / f"{source}.log"


def sources(root: str | Path, *, master: bool) -> dict[str, Path]:
    """Every file a node ships, by source (the controller only runs on the master)."""
    files = {s: unit_log(root, s) for s in UNIT_SOURCES
             if master or s != SOURCE_CONTROLLER}
    files[SOURCE_BOOTSTRAP] = Path(root) / BOOTSTRAP_LOG
    files[SOURCE_JOBS] = unit_log(root, SOURCE_JOBS)
    files[SOURCE_METRICS] = unit_log(root, SOURCE_METRICS)  # metrics_emf.METRICS_LOG
    return files


def render(*, root: str | Path, log_group: str, instance_id: str, master: bool) -> str:
    """The agent's JSON configuration for this node."""
    if not log_group or len(log_group) > 512:
        raise ConfigError(f"log group {log_group!r}: 1 to 512 characters")
    if not instance_id or "/" in instance_id or "{" in instance_id:
        raise ConfigError(f"instance id {instance_id!r} cannot name a log stream")
    collect = [{"file_path": str(path), "log_group_name": log_group,
                "log_stream_name": log_stream(instance_id, source), "timezone": "UTC"}
               for source, path in sources(root, master=master).items()]
    config = {"agent": {"run_as_user": "root"},
              "logs": {"logs_collected": {"files": {"collect_list": collect}},
                       "force_flush_interval": FLUSH_SECONDS}}
    return json.dumps(config, indent=2, sort_keys=True) + "\n"


def collected(config_text: str) -> list[dict[str, str]]:
    """The ``collect_list`` entries of a configuration (what an agent ships), ValueError on
    a file that is not one."""
    data = json.loads(config_text)
    try:
        entries = data["logs"]["logs_collected"]["files"]["collect_list"]
    except (KeyError, TypeError):
        raise ValueError("no logs.logs_collected.files.collect_list") from None
    if not isinstance(entries, list) or not all(
            isinstance(e, dict) and isinstance(e.get("file_path"), str) for e in entries):
        raise ValueError("collect_list entries need a file_path")
    return entries
