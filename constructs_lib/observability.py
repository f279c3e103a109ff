"""ClusterObservability: the cluster's log group, dashboard, alarms and alarm topic.

- **Logs**: one log group per cluster, ``/deeplearning/<cluster id>``, encrypted with a
  key of its own, kept ``log_retention_days``. Every node's CloudWatch agent ships its
  agent, executor, controller, boot and job logs there, one stream per node and source
  (``<instance-id>/<source>``: ``bootstrap_scripts/agent/cloudwatch_config.py``), so a
  node's logs outlive the node and ``dlc logs --source cloudwatch`` reads them without the
  cluster. :meth:`grant_write` lets a node role create streams and put events in this group
  and nowhere else.
- **Dashboard** (``<cluster id>-cluster``): the node groups' size (Auto Scaling group
  metrics, collected by ``NodeGroup``) beside the nodes joined, unhealthy nodes and the
  membership's generation, GPU utilisation (per node and the cluster's mean), each node's
  GPU memory, temperature, power draw, uncorrected ECC errors and retired pages pending,
  jobs running and queued, restarts (the cluster's and each job's) and each job's attempts,
  the cost so far of the cluster's jobs and of each job, each job's step time, samples per
  second and loss: every metric the nodes' EMF lines carry, under the dimension sets they
  carry it (``tests/stack/test_dashboard_metrics.py`` checks both ways), in the namespace
  and dimensions of ``bootstrap_scripts.metrics.metric_names``.
- **Alarms**, to an SNS topic (KMS-encrypted, TLS-only; ``alarm_email`` subscribes an
  address): a node unhealthy, nodes missing from a group for long, a job restarting
  repeatedly, GPUs idle while a job runs, and the shared file system's metered I/O in an
  hour (``AWS/EFS`` ``MeteredIOBytes``): with Elastic throughput each GB read or written is
  billed, so a job that reads or writes EFS in a loop costs money by the hour (docs/cost.md,
  "EFS I/O").

Encryption: CloudWatch Logs and CloudWatch (publishing alarms to the topic) may use the
key for this account and region only (https://docs.aws.amazon.com/AmazonCloudWatch/latest/logs/encrypt-log-data-kms.html,
https://docs.aws.amazon.com/sns/latest/dg/sns-key-management.html).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import NamedTuple

from aws_cdk import Aws, Duration, RemovalPolicy
from aws_cdk import aws_autoscaling as autoscaling
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subs
from constructs import Construct

from bootstrap_scripts.metrics import metric_names as names
from constructs_lib import validation
from constructs_lib.alarm_topic import allow_publish, cloudwatch_alarms_arn
from constructs_lib.validation import ConfigError

#: Days a log group may keep events (CloudWatch Logs' PutRetentionPolicy values).
RETENTION_DAYS: dict[int, logs.RetentionDays] = {
    1: logs.RetentionDays.ONE_DAY, 3: logs.RetentionDays.THREE_DAYS,
    5: logs.RetentionDays.FIVE_DAYS, 7: logs.RetentionDays.ONE_WEEK,
    14: logs.RetentionDays.TWO_WEEKS, 30: logs.RetentionDays.ONE_MONTH,
    60: logs.RetentionDays.TWO_MONTHS, 90: logs.RetentionDays.THREE_MONTHS,
    120: logs.RetentionDays.FOUR_MONTHS, 150: logs.RetentionDays.FIVE_MONTHS,
    180: logs.RetentionDays.SIX_MONTHS, 365: logs.RetentionDays.ONE_YEAR,
    400: logs.RetentionDays.THIRTEEN_MONTHS, 545: logs.RetentionDays.EIGHTEEN_MONTHS,
    731: logs.RetentionDays.TWO_YEARS, 1096: logs.RetentionDays.THREE_YEARS,
    1827: logs.RetentionDays.FIVE_YEARS, 2192: logs.RetentionDays.SIX_YEARS,
    2557: logs.RetentionDays.SEVEN_YEARS, 2922: logs.RetentionDays.EIGHT_YEARS,
    3288: logs.RetentionDays.NINE_YEARS, 3653: logs.RetentionDays.TEN_YEARS,
}
EMAIL_RE = re.compile(r"^[^@\s,;]{1,64}@[A-Za-z0-9.-]{1,253}\.[A-Za-z]{2,}$")
#: How long the cluster's logs are kept.
DEFAULT_LOG_RETENTION_DAYS = 30
#: Restarts of the cluster's jobs within an hour that raise the restart alarm.
RESTARTS_PER_HOUR_ALARM = 3
#: Mean GPU utilisation (percent) below which GPUs count as idle while a job runs.
IDLE_GPU_PERCENT = 5
#: Minutes GPUs must stay idle with a job running before the idle alarm fires (a job's
#: start: data staging, the health gate, rendezvous, take minutes without the GPUs).
IDLE_GPU_MINUTES = 15
#: Minutes a group may have fewer instances in service than desired (launches, a
#: replacement booting take minutes) before the missing-nodes alarm fires.
MISSING_NODES_MINUTES = 20
#: The metrics' period on the dashboard and in the alarms.
PERIOD = Duration.minutes(1)
#: Metered EFS I/O in one hour (GiB of ``MeteredIOBytes``) that raises the EFS I/O alarm.
#: EFS meters a byte written (and metadata) as one and a byte read as a third, and Elastic
#: throughput bills $0.06 per GB written and $0.03 per GB read (us-east-1), so a metered
#: GiB costs $0.064 (writes) to $0.097 (reads): 50 GiB in an hour is $3.2-4.8, about what
#: the default cluster's three g5.xlarge cost an hour ($1.006 each, On-Demand).
DEFAULT_EFS_IO_ALARM_GIB_PER_HOUR = 50
#: The largest threshold a setting accepts (about $100,000 an hour: a typo, not a limit).
MAX_EFS_IO_ALARM_GIB_PER_HOUR = 1_000_000
GIB = 1024 ** 3


class Panel(NamedTuple):
    """One graph of the dashboard: its title, its left axis' series and its right one's."""

    title: str
    left: Sequence[cw.IMetric]
    right: Sequence[cw.IMetric] = ()


def check_retention(construct: str, days: object) -> int:
    """``days`` if CloudWatch Logs accepts it as a retention, ConfigError naming it if not."""
    if isinstance(days, bool) or not isinstance(days, int) or days not in RETENTION_DAYS:
        raise ConfigError(f"{construct}: log_retention_days must be one of "
                          f"{sorted(RETENTION_DAYS)}, got {days!r}")
    return days


def retention_setting(name: str, value: object) -> int:
    """A retention given as text (``-c logRetentionDays=90``) or a number."""
    text = str(value).strip()
    if isinstance(value, bool) or not text.isdigit():
        raise ConfigError(f"{name} must be a number of days, got {value!r}")
    return check_retention(name, int(text))


def check_email(name: str, value: object) -> str:
    """One e-mail address (what an SNS e-mail subscription takes)."""
    text = str(value).strip()
    if not EMAIL_RE.match(text):
        raise ConfigError(f"{name} must be one e-mail address, got {value!r}")
    return text


def dashboard_name(cluster_id: str) -> str:
    """The dashboard's name (``dlc status`` prints its console URL)."""
    return f"{cluster_id}-cluster"


class ClusterObservability(Construct):
    """The cluster's log group, dashboard, alarms and alarm topic (module docstring)."""

    def __init__(self, scope: Construct, construct_id: str, *, cluster_id: str,
                 groups: Sequence[autoscaling.AutoScalingGroup] = (),
                 log_retention_days: int = DEFAULT_LOG_RETENTION_DAYS,
                 alarm_email: str | None = None, efs_file_system_id: str | None = None,
                 efs_io_alarm_gib_per_hour: int = DEFAULT_EFS_IO_ALARM_GIB_PER_HOUR) -> None:
        """
        :param cluster_id: the cluster's id: the log group's and the dashboard's name, the
            ``ClusterId`` dimension of its metrics.
        :param groups: the node groups whose size the dashboard shows and whose missing
            instances raise an alarm. :default: none
        :param log_retention_days: how long the log group keeps events (a value CloudWatch
            Logs accepts: 1, 3, 5, 7, 14, 30, 60, 90, …). :default: 30
        :param alarm_email: an address subscribed to the alarm topic (it must confirm the
            subscription). :default: none (subscribe what you like to ``alarm_topic``)
        :param efs_file_system_id: the shared file system whose metered I/O is alarmed on.
            :default: none (no EFS I/O alarm)
        :param efs_io_alarm_gib_per_hour: GiB of ``MeteredIOBytes`` in one hour that raise
            the EFS I/O alarm; 0: no alarm. :default: 50
        """
        super().__init__(scope, construct_id)
        retention = RETENTION_DAYS[check_retention(f"ClusterObservability {construct_id}",
                                                   log_retention_days)]
        self.cluster_id = cluster_id
        self.key = kms.Key(self, "Key", enable_key_rotation=True,
                           removal_policy=RemovalPolicy.DESTROY,
                           description=f"Encrypts the logs and the alarm topic of cluster "
                                       f"{cluster_id}")
        self.key.add_to_resource_policy(iam.PolicyStatement(
            sid="CloudWatchLogsEncryptsTheClusterLogs",
            principals=[iam.ServicePrincipal(f"logs.{Aws.REGION}.amazonaws.com")],
            actions=["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*"],
            resources=["*"],
            conditions={"StringLike": {"kms:EncryptionContext:aws:logs:arn": (
                f"arn:{Aws.PARTITION}:logs:{Aws.REGION}:{Aws.ACCOUNT_ID}:log-group:*")}}))
        self.log_group = logs.LogGroup(
            self, "NodeLogs", log_group_name=names.log_group_name(cluster_id),
            retention=retention, encryption_key=self.key,
            removal_policy=RemovalPolicy.DESTROY)
        self.alarm_topic = sns.Topic(self, "AlarmTopic", master_key=self.key, enforce_ssl=True,
                                     display_name=f"{cluster_id} cluster alarms")
        # enforce_ssl's topic policy replaced SNS's default: the alarms' actions publish
        # only because this names CloudWatch (constructs_lib/alarm_topic.py)
        allow_publish(self.alarm_topic, self.key, "cloudwatch.amazonaws.com",
                      source_arn=cloudwatch_alarms_arn())
        if alarm_email:
            self.alarm_topic.add_subscription(subs.EmailSubscription(alarm_email))
        self.efs_file_system_id = efs_file_system_id
        self.efs_io_alarm_gib_per_hour = validation.count(
            f"ClusterObservability {construct_id}: efs_io_alarm_gib_per_hour",
            efs_io_alarm_gib_per_hour, minimum=0, maximum=MAX_EFS_IO_ALARM_GIB_PER_HOUR)
        self.alarms = self._alarms(groups)
        self.dashboard = self._dashboard(groups)

    def allow_alarms_from(self, service: str) -> None:
        """Let AWS service principal ``service`` (e.g. ``budgets.amazonaws.com``) publish to
        the alarm topic and use its key for it, for this account only
        (``constructs_lib/alarm_topic.allow_publish``)."""
        allow_publish(self.alarm_topic, self.key, service)

    @property
    def log_group_name(self) -> str:
        return self.log_group.log_group_name

    def grant_write(self, role: iam.IRole) -> iam.Grant:
        """A node role may create streams and put events in this log group only (what the
        CloudWatch agent calls; the group and its retention are the stack's)."""
        return iam.Grant.add_to_principal(
            grantee=role, actions=["logs:CreateLogStream", "logs:PutLogEvents"],
            resource_arns=[self.log_group.log_group_arn])

    def grant_read(self, policy: iam.ManagedPolicy) -> None:
        """Operators read the nodes' logs (``dlc logs --source cloudwatch``) from this log
        group only."""
        policy.add_statements(iam.PolicyStatement(
            sid="ReadTheClusterLogs",
            actions=["logs:DescribeLogStreams", "logs:FilterLogEvents", "logs:GetLogEvents"],
            resources=[self.log_group.log_group_arn]))

    # -- metrics -------------------------------------------------------------------------
    def metric(self, name: str, statistic: str = "Average",
               period: Duration = PERIOD) -> cw.Metric:
        """A cluster-wide metric of the namespace (dimension ``ClusterId`` only)."""
        return cw.Metric(namespace=names.NAMESPACE, metric_name=name, statistic=statistic,
                         period=period, dimensions_map={names.DIM_CLUSTER: self.cluster_id})

    def per_node(self, name: str, label: str, statistic: str = "Average") -> cw.MathExpression:
        """Every node's series of a per-node metric (a SEARCH over ``InstanceId``)."""
        return self.search(name, names.DIM_INSTANCE, label, statistic)

    def per_job(self, name: str, label: str, statistic: str = "Average") -> cw.MathExpression:
        """Every job's series of a per-job metric (a SEARCH over ``JobId``): a job's line
        appears while it runs and reports progress."""
        return self.search(name, names.DIM_JOB, label, statistic)

    def search(self, name: str, dimension: str, label: str,
               statistic: str) -> cw.MathExpression:
        """Every series of ``name`` in this cluster under (``ClusterId``, ``dimension``)
        (https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/search-expression-syntax.html)."""
        return cw.MathExpression(
            expression=(f"SEARCH('{{{names.NAMESPACE},{names.DIM_CLUSTER},{dimension}}} "
                        f"MetricName=\"{name}\" {names.DIM_CLUSTER}=\"{self.cluster_id}\"', "
                        f"'{statistic}', {int(PERIOD.to_seconds())})"),
            using_metrics={}, label=label, period=PERIOD)

    def efs_metered_io(self) -> cw.Metric:
        """The shared file system's metered bytes in an hour (``AWS/EFS`` ``MeteredIOBytes``,
        ``Sum``: reads count a third, writes and metadata in full;
        https://docs.aws.amazon.com/efs/latest/ug/efs-metrics.html)."""
        return cw.Metric(namespace="AWS/EFS", metric_name="MeteredIOBytes", statistic="Sum",
                         period=Duration.hours(1),
                         dimensions_map={"FileSystemId": str(self.efs_file_system_id)})

    @staticmethod
    def group_metric(group: autoscaling.AutoScalingGroup, name: str) -> cw.Metric:
        return cw.Metric(namespace="AWS/AutoScaling", metric_name=name, statistic="Average",
                         period=PERIOD,
                         dimensions_map={"AutoScalingGroupName": group.auto_scaling_group_name})

    # -- alarms --------------------------------------------------------------------------
    def _alarm(self, construct_id: str, metric: cw.IMetric, description: str, *,
               threshold: float, periods: int = 1,
               op: cw.ComparisonOperator = cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD
               ) -> cw.Alarm:
        alarm = metric.create_alarm(
            self, construct_id, threshold=threshold, evaluation_periods=periods,
            comparison_operator=op, alarm_description=description,
            treat_missing_data=cw.TreatMissingData.NOT_BREACHING)
        alarm.add_alarm_action(cw_actions.SnsAction(self.alarm_topic))
        return alarm

    def _alarms(self, groups: Sequence[autoscaling.AutoScalingGroup]) -> list[cw.Alarm]:
        alarms = [
            self._alarm("NodeUnhealthy", self.metric(names.METRIC_UNHEALTHY_NODES, "Maximum"),
                        f"A node of cluster {self.cluster_id} fails its health checks",
                        threshold=1, periods=2),
            self._alarm("JobRestartingRepeatedly",
                        self.metric(names.METRIC_JOB_RESTARTS, "Sum", Duration.hours(1)),
                        f"Jobs of cluster {self.cluster_id} restarted "
                        f"{RESTARTS_PER_HOUR_ALARM} or more times within an hour",
                        threshold=RESTARTS_PER_HOUR_ALARM),
            self._alarm("GpusIdleWhileJobRuns", cw.MathExpression(
                expression=f"IF(jobs > 0 AND gpu < {IDLE_GPU_PERCENT}, 1, 0)",
                using_metrics={"jobs": self.metric(names.METRIC_JOBS_RUNNING, "Maximum"),
                               "gpu": self.metric(names.METRIC_GPU_UTILIZATION)},
                label="GPUs idle while a job runs", period=PERIOD),
                f"A job runs on cluster {self.cluster_id} but its GPUs stayed below "
                f"{IDLE_GPU_PERCENT}% for {IDLE_GPU_MINUTES} minutes",
                threshold=1, periods=IDLE_GPU_MINUTES),
            self._alarm("GpuXidErrors",
                        self.metric(names.METRIC_GPU_XID_ERRORS, "Sum"),
                        f"A GPU of cluster {self.cluster_id} reported an XID error (the "
                        "node's executor log names the code and the device)",
                        threshold=1),
        ]
        if self.efs_file_system_id and self.efs_io_alarm_gib_per_hour:
            alarms.append(self._alarm(
                "EfsIoHigh", self.efs_metered_io(),
                f"The shared file system of cluster {self.cluster_id} metered "
                f"{self.efs_io_alarm_gib_per_hour} GiB or more of I/O within an hour "
                f"(efsIoAlarmGiBPerHour; Elastic throughput bills each GB read and written: "
                f"docs/cost.md, EFS I/O)",
                threshold=self.efs_io_alarm_gib_per_hour * GIB))
        for i, group in enumerate(groups):
            missing = cw.MathExpression(
                expression="desired - inservice",
                using_metrics={"desired": self.group_metric(group, "GroupDesiredCapacity"),
                               "inservice": self.group_metric(group, "GroupInServiceInstances")},
                label="instances missing", period=PERIOD)
            alarms.append(self._alarm(
                f"NodesMissing{i + 1}", missing,
                f"A node group of cluster {self.cluster_id} had fewer instances in service "
                f"than desired for {MISSING_NODES_MINUTES} minutes",
                threshold=1, periods=MISSING_NODES_MINUTES))
        return alarms

    # -- dashboard -----------------------------------------------------------------------
    def _dashboard(self, groups: Sequence[autoscaling.AutoScalingGroup]) -> cw.Dashboard:
        board = cw.Dashboard(self, "Dashboard", dashboard_name=dashboard_name(self.cluster_id),
                             default_interval=Duration.hours(3))
        size = [self.group_metric(g, m) for g in groups
                for m in ("GroupDesiredCapacity", "GroupInServiceInstances",
                          "GroupPendingInstances", "GroupTerminatingInstances")]
        most = functools.partial(self.metric, statistic="Maximum")
        board.add_widgets(*self.graphs(12, [
            Panel("Cluster size (Auto Scaling groups) and nodes joined",
                  [*size, most(names.METRIC_NODES_JOINED).with_(label="nodes joined")]),
            Panel("Unhealthy nodes; membership generation (right)",
                  [most(names.METRIC_UNHEALTHY_NODES)],
                  [most(names.METRIC_MEMBERSHIP_GENERATION).with_(label="generation")])]))
        board.add_widgets(
            cw.GraphWidget(title="GPU utilisation per node and cluster mean (%)", width=24,
                           left=[self.per_node(names.METRIC_GPU_UTILIZATION, ""),
                                 self.metric(names.METRIC_GPU_UTILIZATION).with_(
                                     label="cluster mean")],
                           left_y_axis=cw.YAxisProps(min=0, max=100)))
        # per node: what a GPU in trouble shows before its job fails (memory, heat, power;
        # ECC errors and retired pages, read as a Maximum: any error is one too many)
        board.add_widgets(*self.graphs(6, [
            Panel("GPU memory used per node (MiB)",
                  [self.per_node(names.METRIC_GPU_MEMORY_USED, "")]),
            Panel("Hottest GPU per node (Celsius)",
                  [self.per_node(names.METRIC_GPU_TEMPERATURE, "")]),
            Panel("GPU power draw per node (W)", [self.per_node(names.METRIC_GPU_POWER, "")]),
            Panel("GPU ECC errors (uncorrected), retired pages pending, XIDs",
                  [self.per_node(names.METRIC_GPU_ECC_UNCORRECTED, "ECC", "Maximum"),
                   self.per_node(names.METRIC_GPU_RETIRED_PAGES_PENDING, "retired pages",
                                 "Maximum"),
                   self.per_node(names.METRIC_GPU_XID_ERRORS, "XID", "Sum"),
                   self.metric(names.METRIC_GPU_XID_ERRORS, "Sum").with_(
                       label="XIDs, whole cluster")])], y_min=0))
        # per node, where the image has DCGM: what the hardware did (tensor cores idle
        # while utilisation reads 100% is a memory-bound or badly fused model)
        board.add_widgets(cw.GraphWidget(
            title="DCGM activity per node (%): SM, tensor cores, memory interface", width=24,
            left=[self.per_node(names.METRIC_GPU_SM_ACTIVE, "SM"),
                  self.per_node(names.METRIC_GPU_TENSOR_ACTIVE, "tensor"),
                  self.per_node(names.METRIC_GPU_DRAM_ACTIVE, "DRAM")],
            left_y_axis=cw.YAxisProps(min=0, max=100)))
        # per node, on nodes with EFA: the fabric's traffic, and what a sick path or peer
        # shows (drops, retransmissions, unresponsive or impaired peers)
        board.add_widgets(*self.graphs(12, [
            Panel("EFA traffic per node (bytes per sample)",
                  [self.per_node(names.METRIC_EFA_TX_BYTES, "tx", "Sum"),
                   self.per_node(names.METRIC_EFA_RX_BYTES, "rx", "Sum"),
                   self.per_node(names.METRIC_EFA_RDMA_READ_BYTES, "RDMA read", "Sum"),
                   self.per_node(names.METRIC_EFA_RDMA_WRITE_BYTES, "RDMA write", "Sum")]),
            Panel("EFA drops, retransmissions, peers in trouble",
                  [self.per_node(names.METRIC_EFA_RX_DROPS, "drops", "Sum"),
                   self.per_node(names.METRIC_EFA_RETRANSMITTED_PACKETS, "retransmitted",
                                 "Sum"),
                   self.per_node(names.METRIC_EFA_UNRESPONSIVE_REMOTES, "unresponsive peer",
                                 "Sum"),
                   self.per_node(names.METRIC_EFA_IMPAIRED_CONNECTIONS, "impaired connection",
                                 "Sum")])], y_min=0))
        # the job engine: its queue, its restarts (the cluster's and each job's) and what
        # the jobs' cost ledgers hold so far
        board.add_widgets(*self.graphs(8, [
            Panel("Jobs running and queued",
                  [most(names.METRIC_JOBS_RUNNING), most(names.METRIC_JOBS_QUEUED)]),
            Panel("Job restarts (cluster, per job); attempts per job (right)",
                  [self.metric(names.METRIC_JOB_RESTARTS, "Sum").with_(label="cluster"),
                   self.per_job(names.METRIC_JOB_RESTARTS, "restarts", "Sum")],
                  [self.per_job(names.METRIC_JOB_ATTEMPTS, "attempts", "Maximum")]),
            Panel("Cost so far, cluster and per job (USD)",
                  [most(names.METRIC_CLUSTER_COST).with_(label="cluster"),
                   self.per_job(names.METRIC_JOB_COST, "", "Maximum")])], y_min=0))
        # per job, from its ranks' progress reports (the controller's lines)
        board.add_widgets(*self.graphs(8, [
            Panel("Step time per job (s)", [self.per_job(names.METRIC_STEP_TIME, "")]),
            Panel("Samples per second per job",
                  [self.per_job(names.METRIC_SAMPLES_PER_SECOND, "")]),
            Panel("Loss per job", [self.per_job(names.METRIC_LOSS, "")])]))
        board.add_widgets(cw.AlarmStatusWidget(title="Alarms", alarms=self.alarms, width=24))
        return board

    @staticmethod
    def graphs(width: int, panels: Sequence[Panel], *,
               y_min: float | None = None) -> list[cw.IWidget]:
        """One row of graphs, ``width`` columns each; ``y_min``: every left axis starts
        there (counts and readings that are never negative)."""
        axis = cw.YAxisProps(min=y_min) if y_min is not None else None
        return [cw.GraphWidget(title=p.title, width=width, left=list(p.left),
                               right=list(p.right), left_y_axis=axis) for p in panels]
