"""What each attempt of a managed job runs: the runner's command line, the restart variables,
and how every launcher hands them to the user's command (command generation, no processes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bootstrap_scripts.jobs.cli.dl_run import build_parser
from bootstrap_scripts.jobs.cli.request_args import request_from_args
from bootstrap_scripts.jobs.controller.attempts import (
    attempt_request,
    restart_env,
    runner_argv,
)
from bootstrap_scripts.jobs.engine import launchers as ln
from bootstrap_scripts.jobs.engine import run as engine
from bootstrap_scripts.protocol.membership import build_membership
from bootstrap_scripts.protocol.paths import ClusterPaths
from tests.support.attempt_request import request

EFS = Path("/efs")
MEMBERSHIP = build_membership(
    cluster_id="c", generation=3, efs_mount="/efs",
    master={"instance_id": "i-m", "address": "10.0.0.4", "gpus": 2},
    workers=[{"instance_id": "i-w", "address": "10.0.1.5", "gpus": 2}])




def test_first_attempt_env_has_the_checkpoint_dir_but_no_resume():
    assert restart_env(EFS, "train-1", 0, "ann") == {
        "DL_CHECKPOINT_DIR": "/efs/checkpoints/ann/train-1", "DL_RESTART_COUNT": "0"}


def test_a_restart_resumes_from_the_same_checkpoint_dir():
    assert restart_env(EFS, "train-1", 2, "ann") == {
        "DL_CHECKPOINT_DIR": "/efs/checkpoints/ann/train-1", "DL_RESTART_COUNT": "2",
        "DL_RESUME": "1"}


def test_runner_argv_is_an_unmanaged_run_reading_its_request():
    argv = runner_argv(root="/", efs=EFS,
                       membership=Path("/efs/managed/train-1/attempts/3.membership.json"))
    assert argv[1:6] == ["-m", "bootstrap_scripts.jobs.cli.dl_run", "--unmanaged",
                         "--request", "-"]
    assert argv[argv.index("--membership") + 1].endswith("attempts/3.membership.json")


def test_the_attempt_request_is_the_jobs_under_the_attempts_id():
    req = request("--launcher", "each", "--env", "DL_RESUME=0", "--env", "A=1")
    run = attempt_request(req, attempt_id="train-1.3", efs=EFS, restart_count=2,
                          user="ann")
    assert (run.job_id, run.command, run.cwd) == ("train-1.3", ("python", "train.py"),
                                                  "/efs/code")
    # the controller's variables win over the user's --env; every one is forwarded
    assert run.env["DL_RESUME"] == "1" and run.env["A"] == "1"
    assert run.env["DL_CHECKPOINT_DIR"] == "/efs/checkpoints/ann/train-1"
    assert {"A", "DL_CHECKPOINT_DIR", "DL_RESTART_COUNT", "DL_RESUME"} <= set(run.forward)
    # what the attempt's runner reads on its standard input is the same request
    assert type(run).from_json(run.to_json()) == run


def plan_attempt(launcher: str, restart_count: int) -> tuple[ln.LaunchPlan, dict[str, str]]:
    """The attempt's request, planned by the engine's front door."""
    req = request("--launcher", launcher, "--mxnet-launch", "/opt/launch.py")
    run = attempt_request(req, attempt_id=f"train-1.{restart_count + 1}", efs=EFS,
                          restart_count=restart_count, user="ann")
    return engine.build_plan(run, MEMBERSHIP, ClusterPaths(EFS).job(run.job_id, "ann")), run.env


@pytest.mark.parametrize("launcher", ["torchrun", "mpi", "horovod", "tf", "mxnet", "each"])
@pytest.mark.parametrize("restart_count", [0, 1])
def test_every_launcher_gives_the_command_the_restart_variables(launcher, restart_count):
    plan, env = plan_attempt(launcher, restart_count)
    assert env["DL_CHECKPOINT_DIR"] == "/efs/checkpoints/ann/train-1"
    assert env["DL_RESTART_COUNT"] == str(restart_count)
    assert env.get("DL_RESUME") == ("1" if restart_count else None)
    argvs = [list(p.argv) for s in plan.shares for p in s.procs]
    if launcher in ("mpi", "horovod"):
        # mpirun / horovodrun start the ranks on other nodes: the variables must be forwarded
        (argv,) = argvs
        flat = " ".join(argv)
        for var in ("DL_CHECKPOINT_DIR", "DL_RESTART_COUNT", "DL_RESUME")[
                :3 if restart_count else 2]:
            assert f"-x {var}" in flat, flat
        assert ("-x DL_RESUME" in flat) == bool(restart_count)
    # the command itself is the same on every attempt: resuming is the program's business
    first, _ = plan_attempt(launcher, 0)
    strip = {f"--rdzv-id=train-1.{restart_count + 1}": "", "--rdzv-id=train-1.1": "",
             f"/efs/jobs/ann/train-1.{restart_count + 1}/": "J/", "/efs/jobs/ann/train-1.1/": "J/",
             " -x DL_RESUME": ""}
    if launcher == "mpi":
        argvs = [[a for i, a in enumerate(argv) if "DL_RESUME" not in (a, argv[min(
            i + 1, len(argv) - 1)])] for argv in argvs]

    def norm(argvs: list[list[str]]) -> list[list[str]]:
        out = []
        for argv in argvs:
            row = []
            for a in argv:
                for old, new in strip.items():
                    a = a.replace(old, new)
                row.append(a)
            out.append(row)
        return out

    assert norm(argvs) == norm([list(p.argv) for s in first.shares for p in s.procs])


def test_the_controllers_options_are_not_part_of_the_run():
    opts = ["--launcher", "each", "--max-restarts", "2", "--min-nodes=1", "--detach", "--json",
            "--root", "/r", "--mount-point=/m", "--job-id", "x", "--name", "n", "--cwd", "/c",
            "--replace-timeout", "5", "--max-code-restarts", "1", "--env", "A=1",
            "--torchrun-max-restarts", "4"]
    run = request_from_args(build_parser().parse_args(opts), ["true"], "x")
    assert (run.launcher, run.env["A"], run.torchrun_max_restarts, run.cwd) == (
        "each", "1", 4, "/c")
    assert not {f for f in type(run).__dataclass_fields__ if "restarts" in f} - {
        "torchrun_max_restarts"}


def test_every_attempt_tells_its_ranks_where_to_declare_progress():
    run = attempt_request(request("--launcher", "each"), attempt_id="train-1.2", efs=EFS,
                          restart_count=1, user="ann")
    assert run.env["DL_PROGRESS_DIR"] == "/efs/jobs/ann/train-1.2/progress"
    assert "DL_PROGRESS_DIR" in run.forward
    assert "TORCH_NCCL_DUMP_ON_TIMEOUT" not in run.env  # no hang timeout: torch untouched


def test_a_hang_timeout_sets_torchs_watchdog_unless_the_user_did():
    req = request("--launcher", "mpi", "--hang-timeout", "120",
                  "--env", "TORCH_NCCL_TRACE_BUFFER_SIZE=50")
    assert req.run.hang_timeout == 120
    run = attempt_request(req, attempt_id="train-1.1", efs=EFS, restart_count=0, user="ann")
    assert run.env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "50"  # the user's own wins
    assert run.env["TORCH_FR_DUMP_TEMP_FILE"] == "/efs/jobs/ann/train-1.1/flight/rank_"
    assert float(run.env["DL_COLLECTIVE_TIMEOUT"]) > 120
    assert {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "DL_COLLECTIVE_TIMEOUT"} <= set(run.forward)


def test_a_negative_hang_timeout_is_refused():
    from bootstrap_scripts.protocol.jobs import JobSpecError

    with pytest.raises(JobSpecError, match="--hang-timeout"):
        request("--hang-timeout", "-1")
