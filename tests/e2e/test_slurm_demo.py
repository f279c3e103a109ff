"""End-to-end: ``make demo ARGS="--scheduler slurm"``: the real CDK deploy of the stack with
``-c scheduler=slurm``, every node booting from its user data into Slurm (munged, slurmctld,
slurmd as the installer's units), and the DDP recipe
``bootstrap_scripts/examples/train_digits.sbatch`` submitted unchanged with ``sbatch`` by a
real unprivileged user, trained to its accuracy on the three nodes; afterwards no daemon of
any node's Slurm is left, and neither is the demo's user."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import shutil
import tempfile
from pathlib import Path

import pytest

from emulator import slurm_node
from emulator.nodes import PYTHON
from tests.conftest import REPO_ROOT
from tests.support.demo import assert_nothing_left, check_common, run_demo
from tests.support.users import reachable

pytestmark = pytest.mark.slow


@pytest.fixture()
def short_tmp() -> Path:
    """A short directory everyone may traverse: slurmstepd's sockets live below the node
    roots (a Unix socket's path has 107 bytes at most) and munged refuses a socket below a
    directory others cannot traverse (pytest's own are long and 0700)."""
    path = Path(tempfile.mkdtemp(prefix="dls", dir="/tmp"))
    path.chmod(0o755)
    yield path
    # a demo killed by its timeout never tore down: its nodes' Slurm is found by token
    with contextlib.suppress(OSError, ValueError):
        for n in json.loads((path / "work" / "state.json").read_text()).get("nodes", []):
            slurm_node.stop(n["address"], grace=2)
    shutil.rmtree(path, ignore_errors=True)


def test_the_sbatch_recipe_trains_on_the_deployed_slurm_cluster_as_a_user(short_tmp):
    # the interpreter and this checkout reachable by the demo's user, as on a DLAMI (the
    # demo would open them itself; held here so parallel tests' table stays right)
    with reachable(os.path.realpath(PYTHON), PYTHON, REPO_ROOT):
        code, out, report = run_demo(short_tmp, "--scheduler", "slurm", "--epochs", "5",
                                     "--require-acc", "0.9")
    assert code == 0, out
    live = check_common(short_tmp, report, 3, managed=False)
    assert report["scheduler"] == "slurm"
    job = report["slurm_job"]
    assert job["state"] == "COMPLETED" and job["exit_code"] == "0:0", job
    # the job ran as the demo's unprivileged user, on every node of the cluster
    user, uid = job["user"].rstrip(")").split("(")
    assert user.startswith("dldemo") and int(uid) >= 1000, job
    assert job["num_nodes"] == 3
    assert "accounting storage is disabled" in job["sacct"]
    log = (short_tmp / "work" / "logs" / f"slurm-job-{job['job_id']}.log").read_text()
    # srun -l labels a line with its task number; torch's global rank 0 (which prints the
    # example's summary) is on whichever task joined the rendezvous first
    final = [ln for ln in log.splitlines() if re.match(r"\d+: final acc=", ln)]
    assert final, log
    assert float(final[0].split("final acc=")[1].split()[0]) >= 0.9
    assert re.search(r"^\d+: start world_size=3", log, re.M), log
    assert report["world_size"] == 3 and report["final_acc"] >= 0.9
    assert f"job {job['job_id']} succeeded" in out and "Slurm, as dldemo" in out
    # nothing of any node's Slurm is left (slurmstepd and the tasks leave their groups),
    # nor the demo's user
    assert_nothing_left(short_tmp, report)
    assert not [p for n in live for p in slurm_node.processes(n["address"])]
    with pytest.raises(KeyError):
        pwd.getpwnam(user)
