"""The cluster's CloudWatch names, in one place: the metrics namespace and its dimensions,
and the log sources every node ships to the cluster's log group.

Both sides read this module: the stack (``constructs_lib/observability.py``: the dashboard,
the alarms, the node role's permission) and the nodes (the installer's CloudWatch agent
configuration, ``bootstrap_scripts/agent/cloudwatch_config.py``; the EMF lines of the
executor's GPU sampler and the controller's job metrics,
``bootstrap_scripts/metrics/metrics_emf.py``).
It imports nothing, so runtime code and constructs can share it without either importing
the other's libraries. docs/observability.md lists the names.
"""

from __future__ import annotations

#: The namespace of every custom metric the cluster publishes.
NAMESPACE = "DeepLearningCluster"

#: Dimension: the cluster (its ``dl-cluster:id`` tag); every metric has it.
DIM_CLUSTER = "ClusterId"
#: Dimension: the EC2 instance a per-node metric is about.
DIM_INSTANCE = "InstanceId"
#: Dimension: a managed job's id, for per-job metrics.
DIM_JOB = "JobId"

#: GPU utilisation in percent (0-100): per node (ClusterId, InstanceId), the mean of the
#: node's GPUs; and per cluster (ClusterId), the mean over every node's GPUs.
METRIC_GPU_UTILIZATION = "GPUUtilization"
#: Per cluster (ClusterId): managed jobs running now.
METRIC_JOBS_RUNNING = "JobsRunning"
#: Per cluster (ClusterId), and per job (ClusterId, JobId) while it runs: attempts the job
#: controller restarted (a count per period).
METRIC_JOB_RESTARTS = "JobRestarts"
#: Per cluster (ClusterId): nodes failing their health checks now (0 when all pass).
METRIC_UNHEALTHY_NODES = "UnhealthyNodes"

# The job engine's own facts, from the job controller (``jobs/controller/engine_facts.py``).
#: Per cluster (ClusterId): the nodes in the membership the master's agent applied.
METRIC_NODES_JOINED = "NodesJoined"
#: Per cluster (ClusterId): that membership's generation (it rises with every change).
METRIC_MEMBERSHIP_GENERATION = "MembershipGeneration"
#: Per cluster (ClusterId): managed jobs submitted and waiting for the controller.
METRIC_JOBS_QUEUED = "JobsQueued"
#: Per cluster (ClusterId): USD the managed jobs' cost ledgers hold so far (unit None).
METRIC_CLUSTER_COST = "ClusterCostUSD"
#: Per job (ClusterId, JobId): the running job's attempts so far (1 + its restarts).
METRIC_JOB_ATTEMPTS = "JobAttempts"
#: Per job (ClusterId, JobId): USD the running job's cost ledger holds so far (unit None).
METRIC_JOB_COST = "JobCostUSD"

# Per node (ClusterId, InstanceId), from the job executor's nvidia-smi samples
# (``bootstrap_scripts.metrics.gpu_metrics``): what a failing or overheating GPU shows first.
#: The node's GPUs' memory in use, summed (Megabytes: nvidia-smi's MiB).
METRIC_GPU_MEMORY_USED = "GPUMemoryUsed"
#: The node's hottest GPU, in degrees Celsius (unit None).
METRIC_GPU_TEMPERATURE = "GPUTemperature"
#: The node's GPUs' power draw, summed, in watts (unit None).
METRIC_GPU_POWER = "GPUPowerDraw"
#: Uncorrected ECC errors of the node's GPUs since the driver loaded (volatile), summed:
#: above 0, the GPU raised an XID 48-class error and its work may be corrupt.
METRIC_GPU_ECC_UNCORRECTED = "GPUEccErrorsUncorrected"
#: GPUs of the node with retired memory pages waiting for a GPU reset (a count).
METRIC_GPU_RETIRED_PAGES_PENDING = "GPURetiredPagesPending"
# Per node (ClusterId, InstanceId), from DCGM's profiling fields where the image has DCGM
# (``bootstrap_scripts.metrics.dcgm_metrics``): what the GPUs' hardware did, in percent of the time
# (the GPUs' mean), where nvidia-smi's utilisation only says a kernel ran.
#: Streaming multiprocessors with work resident (``DCGM_FI_PROF_SM_ACTIVE``).
METRIC_GPU_SM_ACTIVE = "GPUSMActive"
#: Tensor core pipes active (``DCGM_FI_PROF_PIPE_TENSOR_ACTIVE``): low while GPUs look
#: busy means a memory-bound or badly fused model.
METRIC_GPU_TENSOR_ACTIVE = "GPUTensorActive"
#: Device memory interface active (``DCGM_FI_PROF_DRAM_ACTIVE``).
METRIC_GPU_DRAM_ACTIVE = "GPUDramActive"
#: XID errors the node's NVIDIA driver reported in the kernel log since the last sample
#: (``bootstrap_scripts.metrics.xid_errors``; a count; only where the executor can read
#: ``/dev/kmsg``).
METRIC_GPU_XID_ERRORS = "GPUXidErrors"

# Per node (ClusterId, InstanceId), from the job executor's reads of the EFA driver's
# counters (``bootstrap_scripts.metrics.efa_counters``): growth since the previous sample, summed
# over the node's EFA devices; only on nodes with EFA.
#: Bytes the node's EFAs sent / received (every kind of traffic).
METRIC_EFA_TX_BYTES = "EFATxBytes"
METRIC_EFA_RX_BYTES = "EFARxBytes"
#: Bytes moved by RDMA reads / writes (NCCL's collectives over EFA use these).
METRIC_EFA_RDMA_READ_BYTES = "EFARdmaReadBytes"
METRIC_EFA_RDMA_WRITE_BYTES = "EFARdmaWriteBytes"
#: Packets received and dropped.
METRIC_EFA_RX_DROPS = "EFARxDrops"
#: SRD packets sent again (a lossy or congested path).
METRIC_EFA_RETRANSMITTED_PACKETS = "EFARetransmittedPackets"
#: Times a remote peer did not answer / a connection was impaired (a sick peer node).
METRIC_EFA_UNRESPONSIVE_REMOTES = "EFAUnresponsiveRemoteEvents"
METRIC_EFA_IMPAIRED_CONNECTIONS = "EFAImpairedConnectionEvents"

# Per job (ClusterId, JobId), from the ranks' progress files (``bootstrap_scripts.progress``)
# as the job controller reads them: written only while some rank's step moves.
#: The ranks' mean time per step, in seconds.
METRIC_STEP_TIME = "StepTime"
#: The ranks' own rates summed: the job's samples per second.
METRIC_SAMPLES_PER_SECOND = "SamplesPerSecond"
#: The ranks' mean reported loss (unit None).
METRIC_LOSS = "Loss"

#: The log sources of a node: the stream of each is ``<instance-id>/<source>``.
SOURCE_AGENT = "agent"
SOURCE_EXECUTOR = "executor"
SOURCE_CONTROLLER = "controller"  # the master's only
SOURCE_BOOTSTRAP = "bootstrap"
SOURCE_JOBS = "jobs"
#: The metrics' EMF lines (``bootstrap_scripts.metrics.metrics_emf``), from the executor and the
#: controller; CloudWatch Logs makes them metrics of :data:`NAMESPACE`.
SOURCE_METRICS = "metrics"
LOG_SOURCES = (SOURCE_AGENT, SOURCE_EXECUTOR, SOURCE_CONTROLLER, SOURCE_BOOTSTRAP, SOURCE_JOBS,
               SOURCE_METRICS)


def log_stream(instance_id: str, source: str) -> str:
    """The stream a node's source goes to in the cluster's log group."""
    return f"{instance_id}/{source}"


def log_group_name(cluster_id: str) -> str:
    """The cluster's log group (one per cluster): ``/deeplearning/<cluster id>``."""
    return f"/deeplearning/{cluster_id}"
