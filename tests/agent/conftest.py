"""Fixtures of the agent tests: the emulator's AWS side, agent threads, emulated nodes."""

from __future__ import annotations

import pytest

from emulator.deploy import aws_env
from emulator.nodes import Node, stop_nodes
from emulator.resources import ClusterResources
from emulator.wait_handle import WaitHandle


@pytest.fixture()
def env(moto_reset, monkeypatch, tmp_path):
    """moto's server for boto3, no nvidia-smi on PATH (0 GPUs), a wait-condition handle, and
    every agent thread a test starts (appended to the list) stopped at teardown."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_reset)
    monkeypatch.setenv("PATH", f"{tmp_path}/nobin:/usr/bin:/bin")
    handle = WaitHandle()
    threads: list = []
    try:
        yield moto_reset, handle, threads
    finally:
        for t in threads:
            t.stop()
        handle.stop()


@pytest.fixture()
def boot_node(tmp_path):
    """Factory: ``boot_node(cluster, role, instance, gpus=0, wait_handle="")`` -> a full
    emulated node (``emulator.nodes``: its own IMDS, the installer run with the arguments of
    its group's launch template, its agent and executor), EFS at ``tmp_path/efs``. Every node
    is stopped at teardown; none may leave a process behind."""
    nodes: list[Node] = []

    def boot(cluster: ClusterResources, role: str, instance, *, gpus: int = 0,
             wait_handle: str = "") -> Node:
        node = Node(instance, role, tmp_path / "nodes" / instance.instance_id, tmp_path / "efs",
                    tmp_path / "logs", gpus=gpus)
        nodes.append(node)
        node.boot(cluster.install_args(role), aws_env(cluster.endpoint), wait_handle)
        return node

    yield boot
    survivors = stop_nodes(nodes)
    assert not survivors, f"processes left behind: {sorted(survivors)}"
