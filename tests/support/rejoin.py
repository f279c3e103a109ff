"""An elastic managed job's supervisor with fake executors and an injected gate (no nodes,
no AWS): the set-up of the rejoin tests."""

from __future__ import annotations

import os
import time
from pathlib import Path

from bootstrap_scripts.jobs.controller import rejoin
from bootstrap_scripts.jobs.controller.supervise import JobSupervisor
from bootstrap_scripts.jobs.engine import managed
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.managed_records import ManagedJob, ManagedRequest, RestartRecord
from bootstrap_scripts.protocol.membership import Membership, build_membership
from bootstrap_scripts.protocol.paths import ClusterPaths, NodePaths
from bootstrap_scripts.protocol.run_request import RunRequest

MASTER = {"instance_id": "i-m", "address": "10.0.0.4"}


W = [{"instance_id": f"i-w{k}", "address": f"10.0.1.{k}"} for k in (1, 2, 3)]


REPLACEMENT = {"instance_id": "i-r", "address": "10.0.1.9"}


def membership(generation: int, *workers: dict) -> Membership:
    return build_membership(cluster_id="c", generation=generation, efs_mount="/efs",
                            master=MASTER, workers=list(workers))


class FakeHealth:
    def __init__(self) -> None:
        self.marked: list[str] = []

    def mark_unhealthy(self, instance_id: str) -> str:
        self.marked.append(instance_id)
        return ""


class FakeExecutors:
    """Executors as the supervisor sees them: ``up`` alive, every other one gone."""

    def __init__(self, up: set[str]) -> None:
        self.up = up

    def alive(self, addresses):
        return [a for a in addresses if a in self.up]

    def gone(self, addresses):
        return {a: "stopped" for a in addresses if a not in self.up}

    def quiet(self, addresses, after):
        return []


def supervisor(tmp_path: Path, *, elastic: bool, gate=None, polls: int = 3,
               job: ManagedJob | None = None) -> JobSupervisor:
    req = ManagedRequest(job_id="j", run=RunRequest(job_id="j", command=("true",),
                                                    elastic=elastic, nnodes="1:8"),
                         submitted_at=1.0, world_size=4, min_nodes=0, replace_timeout=900)
    (tmp_path / "managed").mkdir()
    paths = managed.submit(tmp_path, req)
    ticks = []
    sup = JobSupervisor(root=tmp_path, efs=tmp_path, paths=paths, request=req,
                        job=job or ManagedJob(job_id="j", state="restarting", full_size=4),
                        health=FakeHealth(), gate=gate, tick=lambda: ticks.append(1),
                        stopping=lambda: len(ticks) >= polls)
    return sup


def live(tmp_path: Path, m: Membership) -> None:
    path = NodePaths(tmp_path).membership
    path.parent.mkdir(parents=True, exist_ok=True)
    store.atomic_write(path, m.to_json())


def restarted_job() -> ManagedJob:
    rec = RestartRecord(attempt=1, at=time.time(), kind="node-lost", address="10.0.1.3",
                        instance_id="i-w3", world="survivors-now", full_size=4,
                        next_world_size=3)
    return ManagedJob(job_id="j", state="running", attempt=2, restarts=1, world_size=3,
                      full_size=4, excluded=("i-w3",), restart_log=(rec,))


def grown(tmp_path: Path, gate) -> tuple[JobSupervisor, rejoin.Rejoin]:
    live(tmp_path, membership(4, *W, REPLACEMENT))  # i-w3 still listed, but excluded
    sup = supervisor(tmp_path, elastic=True, gate=gate, job=restarted_job())
    sup.executors = FakeExecutors({"10.0.0.4", "10.0.1.1", "10.0.1.2", "10.0.1.3",
                                   "10.0.1.9"})
    sup.last_nodes_addresses = {"10.0.0.4", "10.0.1.1", "10.0.1.2"}
    jpaths = ClusterPaths(tmp_path).job("j.2")
    jpaths.nodes.mkdir(parents=True)
    return sup, rejoin.Rejoin(jpaths, os.geteuid(), os.getegid())

