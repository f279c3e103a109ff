"""Reusable CDK constructs for distributed deep-learning clusters on AWS.

    from constructs_lib import DeepLearningCluster

Each construct is usable on its own; ``DeepLearningCluster`` composes them.
"""

import os

# jsii relays Node's warnings to Python's stderr as raw bytes (b'!!  Node 20 is end-of-life…')
# when the first construct module starts its Node process; the README says which Node to
# use, so a tool that merely reads the settings (dlc up's preflight, the demo's check of its
# --context) does not print it as noise. Set before aws_cdk is imported below.
for _name, _value in (("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "18,20"),
                      ("JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION", "1"),
                      ("JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION", "1")):
    os.environ.setdefault(_name, _value)

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
