"""Reusable CDK constructs for distributed deep-learning clusters on AWS.

    from constructs_lib import DeepLearningCluster

Each construct is usable on its own; ``DeepLearningCluster`` composes them.
"""

from constructs_lib.capacity_adjuster import CapacityAdjuster
from constructs_lib.cluster import DeepLearningCluster
from constructs_lib.emr_cluster import EmrDeepLearningCluster
from constructs_lib.images import IMAGE_FAMILIES, FixedAmi, deep_learning_ami
from constructs_lib.metadata_queues import MetadataQueues
from constructs_lib.nag_suppressions import acknowledge_cluster_findings
from constructs_lib.network import ClusterNetwork
from constructs_lib.node_group import NodeGroup
from constructs_lib.resume_sources import CheckpointSource
from constructs_lib.shared_storage import SharedFileSystem
from constructs_lib.validation import ConfigError

__all__ = [
    "IMAGE_FAMILIES",
    "CapacityAdjuster",
    "CheckpointSource",
    "ClusterNetwork",
    "ConfigError",
    "DeepLearningCluster",
    "EmrDeepLearningCluster",
    "FixedAmi",
    "MetadataQueues",
    "NodeGroup",
    "SharedFileSystem",
    "acknowledge_cluster_findings",
    "deep_learning_ami",
]
