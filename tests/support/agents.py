"""Node agents for the agent tests: as threads in the test's process, or as emulated nodes.

The AWS side comes from ``emulator.resources`` (:class:`ClusterResources`), the
wait-condition handle from ``emulator.wait_handle``; here are only the test-side helpers
that run agents against them.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from bootstrap_scripts.agent.identity import NodeIdentity
from bootstrap_scripts.agent.node_agent import NodeAgent
from bootstrap_scripts.agent.settings import AgentConfig
from emulator.resources import ClusterResources
from tests.conftest import REGION


class AgentThread:
    """A node agent running in a thread of the test's process (stop() to end it)."""

    def __init__(self, config: AgentConfig, identity: NodeIdentity) -> None:
        self.agent = NodeAgent(config, identity=identity, stop_event=threading.Event())
        self.exit_code: int | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.exit_code = self.agent.run()

    def stop(self) -> None:
        self.agent.stop.set()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive()


def config(cluster: ClusterResources, role: str, tmp: Path, name: str, handle: str = "",
           **kw) -> AgentConfig:
    """An agent of ``cluster`` with its root at ``tmp/nodes/<name>`` and EFS at ``tmp/efs``."""
    return AgentConfig(role=role, cluster_id=cluster.cluster_id, stack_name="s", region=REGION,
                       master_queue_url=cluster.master_queue_url, mount_point=str(tmp / "efs"),
                       wait_handle=handle, root=str(tmp / "nodes" / name), no_mount=True,
                       poll_wait=1, **kw)


def master_identity(cluster: ClusterResources) -> NodeIdentity:
    (iid, ip), = cluster.instances("master")
    return NodeIdentity(iid, "p3.2xlarge", ip, REGION)


def wait_until(predicate, timeout: float = 60.0, interval: float = 0.05, what: str = ""):
    """Poll ``predicate`` until truthy; raise AssertionError naming ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)
