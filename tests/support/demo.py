"""Running ``python -m emulator.demo`` from a test, and proving it left nothing behind.

The demo runs in a subprocess (its own session) with ``--work-dir`` in the test's temp dir,
so its state file and the job shares' records stay readable afterwards; a demo that hangs is
killed by every process group it recorded, so a failing test never leaves a cluster behind.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from bootstrap_scripts.jobs.engine.checkpoints import FLUSH_SUFFIX, RESTORE_SUFFIX
from bootstrap_scripts.jobs.engine.staging import STAGE_SUFFIX
from bootstrap_scripts.node.procgroup import alive, pids_in_groups
from bootstrap_scripts.protocol import paths as pp
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.paths import ClusterPaths, JobPaths
from bootstrap_scripts.protocol.records import ShareStarted
from emulator.address_space import vpc_cidr
from emulator.demo.context import STATE_FILE
from emulator.gpus import instance_type_gpus
from tests.conftest import REPO_ROOT
from tests.support.cluster import job_dirs

DEMO_TIMEOUT = 420


def in_vpc(address: str) -> bool:
    """``address`` is in the emulated VPC of this test process (each pytest-xdist worker's
    own, ``emulator.address_space``), which the demos it starts inherit."""
    return ipaddress.ip_address(address) in ipaddress.ip_network(vpc_cidr())


def demo_env() -> dict[str, str]:
    """This environment without AWS settings: the demo sets its own, to moto only."""
    return {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}


def run_demo(tmp_path: Path, *args: str, timeout: float = DEMO_TIMEOUT) -> tuple[int, str, dict]:
    """(exit status, output, report) of one demo run in ``tmp_path / "work"``."""
    report = tmp_path / "demo-report.json"
    p = subprocess.Popen(
        [sys.executable, "-m", "emulator.demo", "--work-dir", str(tmp_path / "work"),
         "--report", str(report), *args],
        cwd=REPO_ROOT, env=demo_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_everything(tmp_path)
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        raise AssertionError(f"demo timed out; output:\n{out}") from None
    data = json.loads(report.read_text()) if report.exists() else {}
    return p.returncode, out, data


def share_groups(efs: Path) -> set[int]:
    """The process group of every job share an executor acknowledged on ``efs``."""
    groups: set[int] = set()
    with contextlib.suppress(OSError, ValueError):
        for jdir in job_dirs(efs):
            job = JobPaths(jdir)
            suffix = job.started(0).suffix
            groups |= {rec.pgid for _, rec in store.scan_records(job.nodes, ShareStarted,
                                                                  suffix=suffix) if rec.pgid}
    return groups


def recorded_groups(tmp_path: Path) -> set[int]:
    """Every process group the demo recorded (state file) plus every job share's group."""
    work = tmp_path / "work"
    groups: set[int] = set()
    with contextlib.suppress(OSError, ValueError, KeyError):
        state = json.loads((work / STATE_FILE).read_text())
        groups |= {n["group"]["pid"] for n in state["nodes"] if n.get("group")}
        groups |= {r["pid"] for r in state.get("runners", [])}
        if state.get("cloud"):
            groups.add(state["cloud"]["pid"])
    return groups | share_groups(work / "efs")


def kill_everything(tmp_path: Path) -> None:
    for pgid in recorded_groups(tmp_path):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)


def assert_nothing_left(tmp_path: Path, report: dict) -> None:
    groups = recorded_groups(tmp_path)
    assert groups, "the demo recorded no process groups"
    left = pids_in_groups(groups) | {g for g in groups if alive(g)}
    if left:
        kill_everything(tmp_path)
    assert not left, f"processes left behind: {sorted(left)}"
    assert report.get("leftover_pids") == []
    # Including processes that left their group (torchrun workers start new sessions).
    stopped = report.get("stopped_pids") or []
    assert stopped and not [p for p in stopped if alive(p)]


def node_files(report: dict, node: dict) -> dict[str, str]:
    root = Path(node["root"])
    return {rel: (root / rel).read_text() for rel in
            (pp.WORKERS_FILE, pp.MPI_HOSTFILE, pp.MEMBERSHIP_FILE, pp.ENV_FILE, pp.HOSTS_FILE)}


def check_common(tmp_path: Path, report: dict, n_nodes: int, *, managed: bool = True
                 ) -> list[dict]:
    """Assertions every successful scenario shares; returns the running nodes. ``managed``:
    the job was dl-run's (the job controller's checkpoints on EFS), not an sbatch job's."""
    assert report["status"] == "succeeded", report.get("error")
    assert report["stack"]["resources"] > 50
    assert set(report["stack"]["function_env"]) >= {"MASTER_QUEUE_URL", "CLUSTER_ID",
                                                    "CLUSTER_TAG_KEY", "ROLE_TAG_KEY"}
    live = [n for n in report["nodes"] if n["status"] in ("stopped", "running")]
    assert len(live) == n_nodes
    assert [n["role"] for n in live].count("master") == 1
    for n in live:
        assert in_vpc(n["address"])
        # what EC2 says the instance type has (the emulator's stand-in nvidia-smi lists it)
        assert n["gpus"] == (instance_type_gpus(n["instance_type"]) or 0), n
        assert n["env"]["DEEPLEARNING_NODE_ADDR"] == n["address"]
        assert n["env"]["DEEPLEARNING_MASTER_ADDR"] == report["membership"]["nodes"][0]
    signals = report["wait_condition"]
    assert [s["Status"] for s in signals] == ["SUCCESS"]
    assert signals[0]["_content_type"] == ""  # presigned-URL rule: empty Content-Type
    for key in ("bootstrap_s", "deploy_s", "boot_to_membership_s", "job_s", "total_s"):
        assert report["timings"][key] > 0
    epochs = report["epochs"]
    assert epochs and all(e["world_size"] == report["world_size"] for e in epochs)
    assert all(e["samples_per_s"] > 0 for e in epochs)
    efs = tmp_path / "work" / "efs"
    assert ClusterPaths(efs).membership.exists()
    # a managed job checkpoints to <efs>/checkpoints/<user>/<job-id> (DL_CHECKPOINT_DIR)
    if managed:
        assert list((efs / "checkpoints").glob("*/*/latest.json"))
    return live


def training_attempts(cluster: ClusterPaths) -> list[Path]:
    """The demo's training attempts among the jobs on EFS (``torchrun-…``): not the engine's
    own jobs around them (staging ``.stage``, checkpoint ``.restore`` / ``.flush``)."""
    helpers = (STAGE_SUFFIX, RESTORE_SUFFIX, FLUSH_SUFFIX)
    return sorted(d for d in job_dirs(cluster.efs)
                  if d.name.startswith("torchrun-") and not d.name.endswith(helpers))
