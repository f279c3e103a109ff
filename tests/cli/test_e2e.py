"""dlc end to end against ONE kept emulated cluster (``make demo ARGS=--keep``: a master
and two base workers, the worker group's maximum two more so it has room to scale out),
shared by this module and stopped at its end, always. Every command goes through AWS APIs
only: CloudFormation, Auto Scaling, EC2, and SSM Run Command to the master's own CLIs,
played by the emulator's SSM Agent. The node-killing test runs last."""

from __future__ import annotations

import json
import os
import pwd
import re
import signal
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import boto3
import pytest

from bootstrap_scripts.metrics import metric_names as names
from bootstrap_scripts.node.procgroup import alive, pids_in_groups, stop_popen_group
from bootstrap_scripts.protocol.paths import ClusterPaths, JobPaths
from bootstrap_scripts.protocol.run_request import StagingReport
from dlc.cli import main
from dlc.cost import usd as cost_usd
from emulator.demo.context import BIN_DIR
from emulator.pricing import PRICES
from tests.conftest import REPO_ROOT
from tests.support.bounded import dlc_follow, run_bounded
from tests.support.cluster import job_dirs
from tests.support.demo import demo_env, in_vpc
from tests.support.kept import (
    DATA_BUCKET,
    DATA_PREFIX,
    UNREACHABLE_ACC,
    demo_stop,
    readme_dlc_line,
    state_groups,
)

pytestmark = pytest.mark.slow


def dlc(kept: dict, capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["--emulator", str(kept["state_path"]), *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def status_json(kept: dict, capsys) -> dict:
    code, out, err = dlc(kept, capsys, "status", "--json")
    assert code == 0, err
    return json.loads(out)


def listed_jobs(kept: dict, capsys) -> dict[str, dict]:
    """``dlc jobs --json`` by job id; a failing call fails the test with dlc's message."""
    code, out, err = dlc(kept, capsys, "jobs", "--json")
    assert code == 0 and out.strip(), f"dlc jobs --json: exit {code}, stderr: {err}"
    return {j["job_id"]: j for j in json.loads(out)}


def progress_files(efs: Path) -> list[Path]:
    """Every rank's progress file of every job on ``efs`` (``jobs/<user>/<id>/progress/``),
    found through the protocol's paths, for a failure message to show."""
    return [f for d in job_dirs(efs) for f in sorted(JobPaths(d).progress_dir.glob("*.json"))]


def wait_until_over(kept: dict, capsys, job: str, timeout: float = 120.0) -> dict:
    """The job as ``dlc jobs --json`` lists it once it is neither queued nor running."""
    deadline = time.monotonic() + timeout
    while True:
        listed = listed_jobs(kept, capsys)[job]
        if listed["state"] not in ("queued", "running", "restarting"):
            return listed
        assert time.monotonic() < deadline, f"job {job} still {listed['state']} after " \
            f"{timeout:.0f} s: {listed}"
        time.sleep(0.5)


def follow(kept: dict, job: str) -> tuple[int, str, str]:
    """``dlc logs -f JOB`` in its own process with its own time bound (a job that never
    ends fails this test, not the run)."""
    return dlc_follow(kept["state_path"], job)


def has_controller(kept: dict) -> bool:
    master = next(n for n in kept["state"]["nodes"] if n["role"] == "master")
    return (Path(master["root"]) / BIN_DIR / "dl-jobs").exists()


def test_keep_prints_how_to_use_dlc(kept: dict) -> None:
    assert "The emulated cluster is still running (--keep)." in kept["out"]  # failed job too
    assert f"export DLC_EMULATOR={kept['state_path']}" in kept["out"]
    assert "dlc status" in kept["out"] and "dlc submit --" in kept["out"]
    aws = kept["state"]["aws"]
    assert aws["endpoint"].startswith("http://localhost:") and aws["region"] == "us-east-1"


def test_kept_cluster_runs_and_answers_dl_health_on_the_master(kept: dict) -> None:
    """``--keep``: the report says so, the way to stop it is printed, every process group
    is alive, and the master's installed ``dl-health`` finds the cluster healthy."""
    assert kept["report"]["kept"] is True
    assert f"--stop {kept['state_path']}" in kept["out"]
    state = kept["state"]
    groups = {n["group"]["pid"] for n in state["nodes"] if n.get("group")}
    assert groups and all(alive(g) for g in groups | {state["cloud"]["pid"]})
    master = next(n for n in state["nodes"] if n["role"] == "master")
    health = subprocess.run(
        [str(Path(master["root"]) / BIN_DIR / "dl-health"), "--root", master["root"]],
        capture_output=True, text=True, timeout=120)
    assert health.returncode == 0, health.stdout + health.stderr
    assert "healthy" in health.stdout



def test_every_member_speaks_to_the_master_with_its_own_signed_records(kept: dict) -> None:
    """docs/security.md L34 on the deployed stack: each member's key reached the master over
    the node-keys queue (SenderId), and its registration and executor heartbeat on EFS carry
    the signature the master's check believes (a record another node signed would not)."""
    import logging

    from bootstrap_scripts.node.node_keys import RecordCheck
    from bootstrap_scripts.protocol.membership import Membership
    from bootstrap_scripts.protocol.paths import NodePaths
    from bootstrap_scripts.protocol.records import ExecutorHeartbeat, Registration

    master = next(n for n in kept["state"]["nodes"] if n["role"] == "master")
    check = RecordCheck.for_node(NodePaths(master["root"]), logging.getLogger("e2e"))
    assert check.active, "the master serves no node keys"
    efs = ClusterPaths(Path(kept["state"]["work_dir"]) / "efs")
    members = Membership.load(NodePaths(master["root"]).membership).nodes
    assert len(members) == 3
    for node in members:
        iid = node.instance_id
        assert check.record(efs.registration(iid), Registration, instance_id=iid,
                            what="node registration", fields={"instance_id": iid}), iid
        assert check.record(efs.executor_heartbeat(node.address), ExecutorHeartbeat,
                            instance_id=iid, what="executor heartbeat"), node.address
        other = next(n.instance_id for n in members if n.instance_id != iid)
        assert check.record(efs.registration(iid), Registration, instance_id=other,
                            what="node registration") is None  # another node's key: no


def test_dl_health_checks_every_members_records_on_the_master_and_says_unchecked_on_a_worker(
        kept: dict) -> None:
    """docs/security.md L34's readers: the master's installed ``dl-health`` finds every
    member's registration and heartbeat signed by that member; a worker's says it cannot
    check them there."""
    nodes = kept["state"]["nodes"]

    def health(node: dict, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(Path(node["root"]) / BIN_DIR / "dl-health"), "--root",
                               node["root"], *args], capture_output=True, text=True,
                              timeout=120)

    master = next(n for n in nodes if n["role"] == "master")
    res = health(master, "--json")
    report = json.loads(res.stdout or "{}")
    assert report.get("records") == "checked", res.stdout + res.stderr
    assert report["waiting_for_node_key"] == []
    assert {n["signed"]["detail"] for n in report["nodes"]} == {"checked"}
    worker = next(n for n in nodes if n["role"] == "worker")
    res = health(worker)
    assert "node records are unchecked here" in res.stdout, res.stdout + res.stderr


# -- a new user's first hour: a failed job names its cause, the kept cluster still works ------


def test_failed_job_names_its_cause_and_logs_last(kept: dict) -> None:
    out, report = kept["out"], kept["report"]
    work = Path(report["work_dir"])
    last = "\n".join(out.strip().splitlines()[-6:])
    assert re.search(r"demo failed: .*node rank 0 \(\S+\) exited with code 1: error: final "
                     rf"held-out accuracy [\d.]+ is below --require-acc {UNREACHABLE_ACC}",
                     last), last
    (job,) = report["jobs"]
    # a managed job: its one attempt (a code failure is not retried by default) holds the logs
    (nodes,) = (work / "efs" / "jobs").glob(f"*/{job['job_id']}.1/nodes")  # its user's
    assert f"job logs, one per node: {nodes}/<rank>.log" in last
    assert (nodes / "0.log").exists(), "the logs the message points at are gone"
    assert "final held-out accuracy" in report["error"]


def test_readme_commands_work_in_the_kept_master_shell(kept: dict, tmp_path: Path) -> None:
    """The README's commands, as written, in the shell ``--keep`` prints."""
    shell = Path(kept["report"]["work_dir"]) / "master-shell"
    assert f"\n    {shell}\n" in kept["out"], "the short command to enter the shell is not printed"
    env = {k: v for k, v in demo_env().items() if k not in ("PYTHONPATH",)}
    run = dict(cwd=tmp_path, env=env)
    health = run_bounded([str(shell), "dl-health"], 120, **run)
    assert health.returncode == 0, health.stdout + health.stderr
    assert "healthy" in health.stdout
    job = run_bounded([str(shell), "dl-run", "--", "python", "-m",
                       "bootstrap_scripts.examples.train_digits", "--resume", "--epochs", "3"],
                      300, **run)
    assert job.returncode == 0, (job.stdout + job.stderr)[-3000:]
    assert re.search(r"job \S+ succeeded on 3 node\(s\)", job.stderr), job.stderr[-2000:]


def test_status_json_of_a_healthy_cluster(kept: dict) -> None:
    """Through the console entry point in its own process, as a script would run it."""
    res = subprocess.run([sys.executable, "-m", "dlc", "--emulator", str(kept["state_path"]),
                          "status", "--json"], cwd=REPO_ROOT, env=demo_env(),
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    st = json.loads(res.stdout)
    assert st["stack"] == {"name": "DLClusterStack", "status": "CREATE_COMPLETE",
                           "region": "us-east-1"}
    nodes = st["nodes"]
    assert [(n["rank"], n["role"]) for n in nodes] == [(0, "master"), (1, "worker"),
                                                       (2, "worker")]
    assert all(n["healthy"] and n["lifecycle"] == "InService" for n in nodes), nodes
    assert all(n["instance_type"] == "g5.xlarge" and in_vpc(n["address"])
               for n in nodes)
    assert all(n["heartbeat_age_s"] is not None and isinstance(n["gpus"], int)
               for n in nodes), nodes
    gen = st["membership"]["generation"]
    assert isinstance(gen, int) and gen >= 1 and st["membership"]["healthy"] is True
    assert all(n["generation_applied"] == str(gen) for n in nodes)
    assert st["master"] == nodes[0]["instance_id"]
    # the Price List's on-demand price (the emulator's GetProducts, emulator/pricing.py)
    running = [n for n in nodes if n["ec2_state"] in ("running", "pending")]
    assert st["cost"]["unknown"] == {}, st["cost"]
    assert Decimal(st["cost"]["usd_per_hour"]) == Decimal(PRICES[("us-east-1", "g5.xlarge")]) \
        * len(running)
    if has_controller(kept):
        assert st["jobs"]["total"] >= 0 and st["jobs"]["running"] == []
    else:
        assert "dl-jobs is not installed" in st["errors"]["jobs"]


def test_status_and_health_tables(kept: dict, capsys) -> None:
    code, out, _ = dlc(kept, capsys, "status")
    assert code == 0
    for n in kept["state"]["nodes"]:
        if n["status"] == "running":
            assert n["instance_id"] in out and n["address"] in out
    assert "healthy" in out and "/hour on demand" in out and "x g5.xlarge at $" in out
    code, out, _ = dlc(kept, capsys, "health")
    assert code == 0 and out.strip().endswith("healthy")
    code, out, _ = dlc(kept, capsys, "health", "--json")
    assert code == 0 and json.loads(out)["healthy"] is True


def test_submit_the_example_and_follow_it_to_the_end(kept: dict, capsys, job_user) -> None:
    """The README's ``dlc submit --as USER`` and ``dlc logs -f`` lines as written, by a new
    cluster user, on the work dir the demo made (nothing but the interpreter opened)."""
    if not has_controller(kept):
        pytest.skip("the master has no dl-jobs yet (the job controller, contract C1)")
    work = Path(kept["report"]["work_dir"])
    assert work.stat().st_mode & 0o777 == 0o755, "cluster users cannot read the nodes' files"
    code, out, err = dlc(kept, capsys, *readme_dlc_line("dlc submit --as USER -- python",
                                                        job_user))
    assert code == 0, err
    job = out.strip()
    assert readme_dlc_line("dlc logs -f", job=job) == ["logs", "-f", job]
    code, out, err = follow(kept, job)  # the same words, in their own bounded process
    assert code == 0, out[-2000:] + err
    assert f"job {job} succeeded" in err
    assert "final acc=" in out and "epoch=20" in out
    code, out, _ = dlc(kept, capsys, "logs", job, "--node", "1")
    assert code == 0 and "[1 " in out and "[0 " not in out
    assert listed_jobs(kept, capsys)[job]["state"] == "succeeded"


def test_tensorboard_of_a_job_runs_on_the_master_as_its_user(kept: dict, capsys,
                                                             job_user) -> None:
    """dlc tensorboard: the example's scalars served on the master's loopback, as the job's
    user, under the secret path dlc printed, started through the operator channel, then
    reached through the tunnel ``dlc tensorboard`` opens (the real AWS CLI's ``aws ssm
    start-session``, the emulator's Session Manager, its plugin stand-in on PATH): the
    page, rendered by a real headless Chromium through the forwarded port, shows the
    example's scalars."""
    import shutil
    import urllib.error
    import urllib.request

    from emulator import session_plugin
    from tests.conftest import free_port

    if not has_controller(kept):
        pytest.skip("the master has no dl-jobs yet (the job controller, contract C1)")
    code, out, err = dlc(kept, capsys, "submit", "--as", job_user, "--json", "--", "python",
                         "-m", "bootstrap_scripts.examples.train_digits", "--epochs", "1")
    assert code == 0, err
    job = json.loads(out)["job_id"]
    code, out, err = follow(kept, job)
    assert code == 0, out[-2000:] + err
    code, out, err = dlc(kept, capsys, "tensorboard", job, "--minutes", "5", "--dry-run")
    try:
        assert code == 0, err
        found = re.search(r"http://localhost:(\d+)(/[A-Za-z0-9_-]{32,}/) ", out)
        port, secret = int(found.group(1)), found.group(2)
        assert "--document-name AWS-StartPortForwardingSession" in out
        assert f'"portNumber":["{port}"]' in out
        with pytest.raises(urllib.error.HTTPError, match="404"):  # only under its secret path
            urllib.request.urlopen(f"http://127.0.0.1:{port}/data/plugin/scalars/tags",
                                   timeout=10)
        assert f"as uid {pwd.getpwnam(job_user).pw_uid}," in out  # the job's user, not root

        # the tunnel: dlc (a process of its own: it becomes `aws ssm start-session`)
        local = free_port()
        bin_dir = Path(kept["state_path"]).parent / "session-plugin-bin"
        session_plugin.install(bin_dir)
        path = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent),
                                os.environ.get("PATH", "")])
        tunnel = subprocess.Popen(
            [sys.executable, "-m", "dlc", "--emulator", str(kept["state_path"]), "tensorboard",
             job, "--minutes", "5", "--local-port", str(local)],
            cwd=REPO_ROOT, env={**os.environ, "PATH": path}, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            lines: list[str] = []
            deadline = time.monotonic() + 120
            while not any("Waiting for connections" in line for line in lines):
                assert tunnel.poll() is None and time.monotonic() < deadline, "".join(lines)
                lines.append(tunnel.stdout.readline())
            assert any(f"http://localhost:{local}{secret} " in line for line in lines), lines
            url = f"http://127.0.0.1:{local}{secret}data/plugin/scalars/tags"
            deadline, tags = time.monotonic() + 30, {}
            while "loss" not in tags and time.monotonic() < deadline:
                with urllib.request.urlopen(url, timeout=10) as page:
                    tags = next(iter(json.loads(page.read()).values()), {})
                time.sleep(0.5)
            assert {"loss", "accuracy", "step_time_s"} <= set(tags), tags
            chromium = shutil.which("chromium") or "/usr/bin/chromium"
            if os.path.exists(chromium):  # make system-deps installs it (CI has it)
                from playwright.sync_api import sync_playwright

                with sync_playwright() as pw:
                    browser = pw.chromium.launch(executable_path=chromium, headless=True,
                                                 args=["--no-sandbox"])
                    try:
                        tab = browser.new_page()
                        tab.goto(f"http://localhost:{local}{secret}#timeseries")
                        tab.wait_for_function(
                            "t => t.every(x => document.body.innerText.split(/\\s+/)"
                            ".includes(x))", arg=["loss", "accuracy"], timeout=25_000)
                    finally:
                        browser.close()
            # Ctrl-C in dlc tensorboard's terminal: SIGINT to its process group (dlc became
            # the AWS CLI, which ignores it while the plugin runs): the tunnel must end
            os.killpg(tunnel.pid, signal.SIGINT)
            try:
                tunnel.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pytest.fail("Ctrl-C (SIGINT to its process group) did not stop dlc tensorboard")
        finally:
            stop_popen_group(tunnel)
    finally:
        code, out, err = dlc(kept, capsys, "tensorboard", job, "--stop")
    assert code == 0 and "stopped TensorBoard" in out, out + err


def test_logs_follow_a_three_node_job_every_line_once(kept: dict, capsys, job_user) -> None:
    """``dlc logs -f`` of a job writing numbered lines on all three nodes (each line in two
    writes) through Run Command pages: every node's every number exactly once, whole, in
    order, prefixed with its node; the output spans many pages (about 150 KB)."""
    if not has_controller(kept):
        pytest.skip("the master has no dl-jobs yet (the job controller, contract C1)")
    count = 2000
    script = os.path.join(REPO_ROOT, "tests", "support", "numbered_lines.py")
    code, out, err = dlc(kept, capsys, "submit", "--as", job_user, "--launcher", "each",
                         "--json", "--", "python", script, str(count))
    assert code == 0, err
    job = json.loads(out)["job_id"]
    code, out, err = follow(kept, job)
    assert code == 0 and f"job {job} succeeded" in err, out[-2000:] + err
    numbers: dict[str, list[int]] = {}
    for line in out.splitlines():
        m = re.fullmatch(r"\[(\d+ 127\.[0-9.]+)\] num=(\d+)", line)
        assert m, f"not a whole, prefixed line: {line!r}"
        numbers.setdefault(m.group(1), []).append(int(m.group(2)))
    assert len(numbers) == 3, sorted(numbers)
    for node, got in numbers.items():
        assert got == list(range(count)), (node, len(got))


def test_logs_from_cloudwatch_every_nodes_lines_without_the_master(kept: dict, capsys,
                                                                   job_user) -> None:
    """The nodes' CloudWatch agents (the emulator's, on the configuration each node's
    installer wrote) ship the executors' copies of a job's output; ``dlc logs --source
    cloudwatch`` reads them back from the cluster's log group, each node's every line once,
    with the prefix it has from EFS; the dashboard's URL is in ``dlc status``."""
    if not has_controller(kept):
        pytest.skip("the master has no dl-jobs yet (the job controller, contract C1)")
    count = 40
    script = os.path.join(REPO_ROOT, "tests", "support", "numbered_lines.py")
    code, out, err = dlc(kept, capsys, "submit", "--as", job_user, "--launcher", "each",
                         "--json", "--", "python", script, str(count))
    assert code == 0, err
    job = json.loads(out)["job_id"]
    code, out, err = follow(kept, job)
    assert code == 0 and f"job {job} succeeded" in err, out[-2000:] + err
    from_efs = sorted(out.splitlines())
    deadline = time.monotonic() + 60  # the agents upload every 5 s
    while True:
        code, out, err = dlc(kept, capsys, "logs", job, "--source", "cloudwatch")
        assert code == 0, err
        if len(out.splitlines()) >= len(from_efs) or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert sorted(out.splitlines()) == from_efs and len(from_efs) == 3 * count
    st = status_json(kept, capsys)
    assert "#dashboards/dashboard/" in (st.get("dashboard") or "")


def test_submit_a_laptop_directory_with_workdir(kept: dict, capsys, job_user,
                                               tmp_path: Path) -> None:
    """``dlc submit --workdir``: a script that exists only in a temp dir on the "laptop"
    runs on all three nodes in the job's own directory on EFS, as the user, with the files
    .gitignore and .dlcignore name left behind."""
    if not has_controller(kept):
        pytest.skip("the master has no dl-jobs yet (the job controller, contract C1)")
    laptop = tmp_path / "project"
    (laptop / "data").mkdir(parents=True)
    (laptop / "build").mkdir()
    (laptop / "train.sh").write_text(
        "set -e\necho \"ran in $(pwd) as $(id -un)\"\ncat data/input.txt\n"
        "for f in secret.txt build/big.bin; do test ! -e $f || echo \"shipped $f\"; done\n"
        # a server that binds the wildcard (as TensorFlow's gRPC server does): on its own
        # node's address, as on an instance of its own, however the job was submitted
        "python -c \"import socket; s = socket.socket(); s.bind(('0.0.0.0', 0)); "
        "print('bound', s.getsockname()[0])\"\n")
    (laptop / "data" / "input.txt").write_text("only-on-the-laptop\n")
    (laptop / ".gitignore").write_text("build/\n")
    (laptop / ".dlcignore").write_text("secret.txt\n")
    (laptop / "secret.txt").write_text("never shipped\n")
    (laptop / "build" / "big.bin").write_bytes(b"\0" * 1024)
    code, out, err = dlc(kept, capsys, "submit", "--as", job_user, "--launcher", "each",
                         "--workdir", str(laptop), "--json", "--", "sh", "train.sh")
    assert code == 0, err
    assert "staged 4 file(s)" in err and "/workdirs/" + job_user + "/" in err
    job = json.loads(out)["job_id"]
    code, out, err = follow(kept, job)
    assert code == 0 and f"job {job} succeeded" in err, out[-2000:] + err
    efs = Path(kept["report"]["work_dir"]) / "efs"
    workdir = efs / "managed" / job_user / job / "workdir"
    lines = out.splitlines()
    assert sum(f"ran in {workdir} as {job_user}" in ln for ln in lines) == 3, out
    assert sum(ln.endswith("] only-on-the-laptop") for ln in lines) == 3, out
    assert "shipped" not in out
    assert (workdir / "train.sh").stat().st_uid == pwd.getpwnam(job_user).pw_uid
    members = [n for n in status_json(kept, capsys)["nodes"] if n.get("rank") is not None]
    for n in members:  # each rank bound its own node's address
        assert f"[{n['rank']} {n['address']}] bound {n['address']}" in out, out


def test_a_job_resumes_from_the_s3_mirror_after_its_efs_copy_was_deleted(
        kept: dict, capsys, job_user) -> None:
    """A managed job's checkpoints are mirrored to the checkpoint bucket as its user; with
    that job's EFS copy deleted, a new job started ``--resume-from`` its mirror fetches the
    newest complete checkpoint to EFS and resumes from it."""
    if not has_controller(kept):
        pytest.skip("the master has no dl-jobs yet (the job controller, contract C1)")
    aws = kept["state"]["aws"]
    cfn = boto3.client("cloudformation", endpoint_url=aws["endpoint"], region_name="us-east-1")
    s3 = boto3.client("s3", endpoint_url=aws["endpoint"], region_name="us-east-1")
    bucket = next(o["OutputValue"] for st in cfn.describe_stacks()["Stacks"]
                  for o in st.get("Outputs", []) if o["OutputKey"] == "CheckpointBucketName")
    example = ("python", "-m", "bootstrap_scripts.examples.train_digits", "--require-acc",
               "0.3", "--global-batch-size", "64")
    code, out, err = dlc(kept, capsys, "submit", "--as", job_user, "--json", "--", *example,
                         "--epochs", "2")
    assert code == 0, err
    first = json.loads(out)["job_id"]
    code, out, err = follow(kept, first)
    assert code == 0 and f"job {first} succeeded" in err, out[-2000:] + err
    listed = s3.list_objects_v2(Bucket=bucket, Prefix="checkpoints/").get("Contents", [])
    mirrored = sorted(o["Key"] for o in listed if f"/{job_user}/{first}/" in o["Key"])
    assert any(k.endswith("/epoch-0002.manifest.json") for k in mirrored), mirrored
    assert any(k.endswith("/epoch-0002.pt") for k in mirrored), mirrored
    prefix = mirrored[0].rsplit("/", 1)[0] + "/"
    shown = listed_jobs(kept, capsys)[first].get("checkpoint", {})
    assert shown["s3"] == f"s3://{bucket}/{prefix}epoch-0002.manifest.json", shown
    efs = Path(kept["report"]["work_dir"]) / "efs"
    ckdir = efs / "checkpoints" / job_user / first
    assert (ckdir / "epoch-0002.manifest.json").exists()
    subprocess.run(["rm", "-rf", str(ckdir)], check=True)  # the EFS copy is gone
    code, out, err = dlc(kept, capsys, "submit", "--as", job_user, "--json", "--resume-from",
                         f"s3://{bucket}/{prefix}", "--", *example, "--epochs", "3",
                         "--resume")
    assert code == 0, err
    second = json.loads(out)["job_id"]
    code, out, err = follow(kept, second)
    assert code == 0 and f"job {second} succeeded" in err, out[-2000:] + err
    assert "resumed_from=epoch-0002.pt" in out and "epoch=3" in out and "epoch=1 " not in out
    fetched = efs / "checkpoints" / job_user / second / "epoch-0002.manifest.json"
    assert fetched.stat().st_uid == pwd.getpwnam(job_user).pw_uid  # fetched as the user


def cloudwatch_of(kept: dict, capsys) -> tuple[Any, dict, str]:
    """The emulator's CloudWatch, ``dlc status --json`` and the cluster id the dashboard's
    name carries (the metrics' ``ClusterId``); skipped without a job controller."""
    if not has_controller(kept):
        pytest.skip("the master has no dl-jobs yet (the job controller, contract C1)")
    aws = kept["state"]["aws"]
    cw = boto3.client("cloudwatch", endpoint_url=aws["endpoint"], region_name=aws["region"])
    st = status_json(kept, capsys)
    return cw, st, st["dashboard"].rsplit("/", 1)[1].removesuffix("-cluster")


def test_gpu_and_job_metrics_reach_cloudwatch_with_the_dashboards_dimensions(
        kept: dict, capsys) -> None:
    """The metrics path end to end, on the jobs earlier tests ran: the executors' GPU
    samplers (each node's stand-in nvidia-smi) and the controller append EMF lines, the
    nodes' CloudWatch agents ship them and (CloudWatch Logs' part, the emulator's) they
    become metrics, read back with ListMetrics / GetMetricData under the dimension sets
    the dashboard graphs: every GPU node's readings, the cluster's mean, JobsRunning,
    UnhealthyNodes (0 now), and StepTime / SamplesPerSecond / Loss of the example's jobs
    (the only ones here that report progress), each a job ``dlc jobs`` knows."""
    from emulator.gpus import NODE_BIN_DIR
    from tests.support import cloudwatch_metrics as cwm

    cw, st, cluster = cloudwatch_of(kept, capsys)
    members = {n["instance_id"] for n in st["nodes"] if n["rank"] is not None}
    gpu_nodes = {n["instance_id"] for n in kept["state"]["nodes"]
                 if (Path(n["root"]) / NODE_BIN_DIR / "nvidia-smi").exists()} & members
    known = set(listed_jobs(kept, capsys))
    assert len(gpu_nodes) >= 2, (gpu_nodes, members)
    deadline = time.monotonic() + 60  # a sample every 30 s, shipped every 5 s
    while True:
        jobs = {d[names.DIM_JOB] for d in cwm.dimension_sets(cw, names.METRIC_STEP_TIME)
                if d.get(names.DIM_CLUSTER) == cluster}
        gaps = cwm.missing(cw, cluster, gpu_nodes, jobs) + ([] if jobs else ["any StepTime"])
        if not gaps or time.monotonic() > deadline:
            break
        time.sleep(3)
    efs = Path(kept["report"]["work_dir"]) / "efs"
    assert not gaps, (f"missing {gaps}; lines the nodes wrote: "
                      f"{cwm.written([n['root'] for n in kept['state']['nodes']])}; "
                      f"progress files: {progress_files(efs)[:6]}")
    assert jobs <= known, (jobs, known)
    for d in cwm.dimension_sets(cw, names.METRIC_GPU_TEMPERATURE):
        assert sorted(d) == [names.DIM_CLUSTER, names.DIM_INSTANCE], d
    c = {names.DIM_CLUSTER: cluster}
    for instance in gpu_nodes:
        util = cwm.values(cw, names.METRIC_GPU_UTILIZATION, {**c, names.DIM_INSTANCE: instance})
        temp = cwm.values(cw, names.METRIC_GPU_TEMPERATURE, {**c, names.DIM_INSTANCE: instance})
        assert all(0 <= u <= 100 for u in util) and all(20 < t < 100 for t in temp), (util, temp)
    assert max(cwm.values(cw, names.METRIC_JOBS_RUNNING, c, "Maximum")) == 1
    assert cwm.values(cw, names.METRIC_UNHEALTHY_NODES, c, "Maximum")[0] == 0
    for job in jobs:
        j = {**c, names.DIM_JOB: job}
        assert min(cwm.values(cw, names.METRIC_STEP_TIME, j)) > 0
        assert min(cwm.values(cw, names.METRIC_SAMPLES_PER_SECOND, j)) > 0
        assert all(0 <= v < 10 for v in cwm.values(cw, names.METRIC_LOSS, j))


def test_submit_then_cancel(kept: dict, capsys, job_user) -> None:
    if not has_controller(kept):
        pytest.skip("the master has no dl-jobs yet (the job controller, contract C1)")
    code, out, err = dlc(kept, capsys, "submit", "--as", job_user, "--launcher", "each", "--",
                         "sleep", "600")
    assert code == 0, err
    job = out.strip()
    code, out, err = dlc(kept, capsys, "cancel", job)
    assert code == 0, err
    assert wait_until_over(kept, capsys, job, timeout=60)["state"] == "cancelled"
    code, _, err = dlc(kept, capsys, "cancel", "no-such-job")
    assert code == 3 and "job no-such-job not found" in err and job in err


def test_submit_with_max_cost_stops_the_job_at_its_cap(kept: dict, capsys, job_user) -> None:
    """``dlc submit --max-cost``: the master's controller prices the three nodes through
    EC2 and the Price List (the emulator's table), stops the job like a cancel once the
    ledger reaches the cap, and records it ``budget``; ``dlc jobs`` shows the cost."""
    if not has_controller(kept):
        pytest.skip("the master has no dl-jobs yet (the job controller, contract C1)")
    code, out, err = dlc(kept, capsys, "submit", "--as", job_user, "--launcher", "each",
                         "--max-cost", "0.01", "--json", "--", "sleep", "600")
    assert code == 0, err
    job = json.loads(out)["job_id"]
    listed = wait_until_over(kept, capsys, job)
    assert listed["state"] == "budget", listed
    assert listed["max_cost_usd"] == "0.01" and listed["restarts"] == 0
    assert "--max-cost 0.01 USD" in listed["message"], listed["message"]
    (attempt,) = listed["usage"]
    assert {n["usd_per_hour"] for n in attempt["nodes"]} == {
        PRICES[("us-east-1", "g5.xlarge")].rstrip("0")}
    spent = Decimal(str(listed["cost"]["usd"]))  # a JSON number, to a millionth
    assert Decimal("0.01") <= spent < Decimal("0.02"), listed["cost"]
    code, out, _ = dlc(kept, capsys, "jobs")
    assert code == 0 and f"{cost_usd(str(spent))}/0.01" in out
    # the demo's own job got its ledger into demo-report.json the same way
    (demo_job,) = [j for j in kept["report"]["jobs"] if j.get("managed_id")][:1]
    assert Decimal(demo_job["cost"]["usd"]) > 0 and not demo_job["cost"]["unknown"]


def test_engine_metrics_reach_cloudwatch_with_the_dashboards_dimensions(kept: dict,
                                                                       capsys) -> None:
    """The controller's engine facts end to end, after the jobs above (the capped one last):
    NodesJoined and MembershipGeneration as ``dlc status`` has them, JobsQueued 0, the
    cluster's ClusterCostUSD the sum of the jobs' ledgers as ``dlc jobs`` prices them, and
    per job (the capped one) JobCostUSD its ledger, JobAttempts 1 and JobRestarts 0, read
    back from CloudWatch under the dimension sets the dashboard graphs."""
    from tests.support import cloudwatch_metrics as cwm

    cw, st, cluster = cloudwatch_of(kept, capsys)
    members = [n for n in st["nodes"] if n["rank"] is not None]
    jobs = list(listed_jobs(kept, capsys).values())
    assert all(j["state"] not in ("queued", "running") for j in jobs), jobs
    spent = sum(Decimal(str(j["cost"]["usd"])) for j in jobs if j["cost"]["usd"] != "unknown")
    capped = next(j for j in jobs if j["max_cost_usd"] == "0.01")
    c = {names.DIM_CLUSTER: cluster}
    j = {**c, names.DIM_JOB: capped["job_id"]}

    def newest(name: str, dims: dict[str, str], stat: str = "Maximum") -> float | None:
        got = cwm.values(cw, name, dims, stat)
        return got[0] if got else None

    def now_seen() -> dict[str, float | None]:
        return {"nodes": newest(names.METRIC_NODES_JOINED, c),
                "generation": newest(names.METRIC_MEMBERSHIP_GENERATION, c),
                "queued": newest(names.METRIC_JOBS_QUEUED, c),
                "cluster_usd": newest(names.METRIC_CLUSTER_COST, c),
                "job_usd": newest(names.METRIC_JOB_COST, j),
                "attempts": newest(names.METRIC_JOB_ATTEMPTS, j),
                "restarts": newest(names.METRIC_JOB_RESTARTS, j, "Sum")}

    wanted = {"nodes": len(members), "generation": st["membership"]["generation"],
              "queued": 0, "attempts": 1, "restarts": 0}
    deadline = time.monotonic() + 120  # a line every 50 s (at once when a job ends)
    while True:
        seen = now_seen()
        costs_right = seen["cluster_usd"] is not None and seen["job_usd"] is not None and \
            abs(Decimal(str(seen["cluster_usd"])) - spent) < Decimal("0.001") and \
            abs(Decimal(str(seen["job_usd"])) - Decimal(str(capped["cost"]["usd"]))) < \
            Decimal("0.001")
        if (costs_right and {k: seen[k] for k in wanted} == wanted) or \
                time.monotonic() > deadline:
            break
        time.sleep(3)
    assert costs_right and {k: seen[k] for k in wanted} == wanted, (
        seen, wanted, str(spent), capped["cost"],
        cwm.written([n["root"] for n in kept["state"]["nodes"]]))
    assert Decimal("0.01") <= Decimal(str(seen["job_usd"])) < Decimal("0.02")
    for name in (names.METRIC_JOB_COST, names.METRIC_JOB_ATTEMPTS):
        assert all(sorted(d) == [names.DIM_CLUSTER, names.DIM_JOB]
                   for d in cwm.dimension_sets(cw, name)), name


def test_a_mount_fails_clearly_on_an_emulated_node(kept: dict, capsys, job_user) -> None:
    """``dlc submit --mount``: the emulated nodes cannot run Mountpoint for Amazon S3 (no
    FUSE, no mount-s3; docs/emulator.md), so the job fails before it runs, saying so,
    instead of running on an empty directory."""
    if not has_controller(kept):
        pytest.skip("the master has no dl-jobs yet (the job controller, contract C1)")
    code, out, err = dlc(kept, capsys, "submit", "--as", job_user, "--launcher", "each",
                         "--max-restarts", "0", "--json",
                         "--mount", f"s3://dl-demo-datasets/digits:/home/{job_user}/digits",
                         "--", "ls", f"/home/{job_user}/digits")
    assert code == 0, err
    job = json.loads(out)["job_id"]
    listed = wait_until_over(kept, capsys, job)
    assert listed["state"] == "failed", listed
    code, out, err = dlc(kept, capsys, "logs", job)
    assert "mount-s3 is not available on this node" in out + err + listed["message"], (
        listed, out[-2000:], err[-2000:])


def submit_reading_data(kept: dict, capsys, job_user: str, source: str, laptop: Path) -> str:
    """``dlc submit --data SOURCE`` of ``laptop``'s ``read.sh`` on every node (``each``):
    the job's id."""
    code, out, err = dlc(kept, capsys, "submit", "--as", job_user, "--launcher", "each",
                         "--max-restarts", "0", "--data", source, "--workdir", str(laptop),
                         "--json", "--", "sh", "read.sh")
    assert code == 0, err
    return json.loads(out)["job_id"]


def followed_staging(kept: dict, job_user: str, job: str) -> tuple[str, StagingReport]:
    """``job`` followed to its success: (its output, its attempt's ``staging.json``)."""
    code, out, err = follow(kept, job)
    assert code == 0 and f"job {job} succeeded" in err, out[-2000:] + err
    efs = ClusterPaths(Path(kept["report"]["work_dir"]) / "efs")
    record = efs.job(f"{job}.1", job_user).staging  # the first (only) attempt's
    return out, StagingReport.from_json(record.read_text(), source=str(record))


def test_submit_with_data_stages_it_on_every_node_once(kept: dict, capsys, job_user,
                                                        tmp_path: Path) -> None:
    """``dlc submit --data``: every node's executor copies the prefix of the cluster's data
    bucket (``dataBucket``/``dataPrefix`` of the kept deploy) to its own local disk as the
    job's user before the job starts, each rank reads its node's copy through
    ``$DL_DATA_DIR``, and the attempt's ``staging.json`` names every node's directory and
    bytes; a second job on the same data copies nothing (the record's ``copied`` is 0).
    Both are submitted at once: the controller runs one job at a time, first come first
    served, so the second stages only once the first has ended."""
    from bootstrap_scripts.protocol.membership import Membership
    from bootstrap_scripts.protocol.paths import NodePaths

    if not has_controller(kept):
        pytest.skip("the master has no dl-jobs yet (the job controller, contract C1)")
    aws = kept["state"]["aws"]
    s3 = boto3.client("s3", endpoint_url=aws["endpoint"], region_name=aws["region"])
    token = os.urandom(8).hex()  # this run's bytes: a stale copy cannot pass for them
    objects = {"a.txt": f"alpha-{token}\n".encode(), "sub/b.txt": f"beta-{token}\n".encode(),
               "sub/c.bin": bytes(range(256)) * 8}
    prefix = f"{DATA_PREFIX}{token}/"
    s3.create_bucket(Bucket=DATA_BUCKET)
    for key, body in objects.items():
        s3.put_object(Bucket=DATA_BUCKET, Key=prefix + key, Body=body)
    laptop = tmp_path / "project"
    laptop.mkdir()
    (laptop / "read.sh").write_text(  # dlc's arguments cannot carry a '$': a script can
        "set -e\necho \"dir=$DL_DATA_DIR\"\ncat \"$DL_DATA_DIR/a.txt\" "
        "\"$DL_DATA_DIR/sub/b.txt\"\ncksum < \"$DL_DATA_DIR/sub/c.bin\"\n")
    source = f"s3://{DATA_BUCKET}/{prefix}"
    total = sum(len(b) for b in objects.values())
    crc = subprocess.run(["cksum"], input=objects["sub/c.bin"], capture_output=True,
                         check=True).stdout.decode().strip()
    master = next(n for n in kept["state"]["nodes"] if n["role"] == "master")
    members = {n.address for n in Membership.load(NodePaths(master["root"]).membership).nodes}
    assert len(members) == 3, members

    def ranks_read(out: str, record: StagingReport) -> None:
        lines = out.splitlines()
        for node in record.nodes:
            said = [ln.split("] ", 1)[1] for ln in lines if ln.startswith(f"[{node.rank} ")]
            for line in (f"dir={node.directory}", f"alpha-{token}", f"beta-{token}", crc):
                assert line in said, (node, line, out[-2000:])

    job = submit_reading_data(kept, capsys, job_user, source, laptop)
    again = submit_reading_data(kept, capsys, job_user, source, laptop)
    assert again != job
    out, first = followed_staging(kept, job_user, job)
    assert first.source == source and {n.address for n in first.nodes} == members, first
    assert len({n.directory for n in first.nodes}) == 3  # each node its own local disk
    for node in first.nodes:
        assert (node.objects, node.bytes, node.copied, node.copied_bytes) == (
            3, total, 3, total), node
        for key, body in objects.items():  # the node's copy: the bucket's bytes, the user's
            staged = Path(node.directory) / key
            assert staged.read_bytes() == body, staged
            assert staged.stat().st_uid == pwd.getpwnam(job_user).pw_uid, staged
    ranks_read(out, first)

    out, second = followed_staging(kept, job_user, again)
    assert {n.rank: n.directory for n in second.nodes} == {
        n.rank: n.directory for n in first.nodes}
    for node in second.nodes:  # listed and found complete: nothing fetched again
        assert (node.objects, node.bytes, node.copied, node.copied_bytes) == (
            3, total, 0, 0), node
    ranks_read(out, second)


def test_scale_out_and_in(kept: dict, capsys) -> None:
    """On the kept cluster the emulator's service still plays Auto Scaling and EC2: scaling
    out boots a node that joins the membership; scaling in drains and stops it."""
    aws = kept["state"]["aws"]
    asg = boto3.client("autoscaling", endpoint_url=aws["endpoint"], region_name="us-east-1")
    service = json.loads(kept["state_path"].read_text()).get("service")
    assert service and alive(service["pid"]), "the kept cluster has no emulator service"

    def workers() -> dict:
        groups = asg.describe_auto_scaling_groups()["AutoScalingGroups"]
        return next(g for g in groups if {"Key": "NodeType", "Value": "Worker"}
                    in [{"Key": t["Key"], "Value": t["Value"]} for t in g["Tags"]])

    def members_become(n: int, why: str) -> dict:
        for _ in range(360):
            st = status_json(kept, capsys)
            members = [x for x in st["nodes"] if x.get("rank") is not None]
            if len(members) == n and st["membership"].get("healthy") and \
                    all(x["healthy"] for x in members):
                return st
            time.sleep(0.5)
        raise AssertionError(f"{why}: never {n} healthy members: {st}")

    assert workers()["DesiredCapacity"] == 2  # the base workers (maxWorkers: 4)
    code, out, err = dlc(kept, capsys, *readme_dlc_line("dlc scale --status"))
    assert code == 0, err
    assert "workers desired 2 (min 1, max 4, base 2)" in out
    before = status_json(kept, capsys)["membership"]["generation"]
    code, out, err = dlc(kept, capsys, *readme_dlc_line("dlc scale --workers 3"))
    assert code == 0, err
    assert "watch with dlc scale --status" in out
    assert "workers 2 -> 3" in out
    group = workers()
    assert group["DesiredCapacity"] == 3 and len(group["Instances"]) == 3
    st = members_become(4, "scale out to 3 workers")
    assert st["membership"]["generation"] > before
    added = {x["instance_id"] for x in st["nodes"]} - \
        {n["instance_id"] for n in kept["state"]["nodes"]}
    assert len(added) == 1, st["nodes"]
    code, out, err = dlc(kept, capsys, "scale", "--workers", "2")
    assert code == 0, err
    assert workers()["DesiredCapacity"] == 2 and "workers 3 -> 2" in out
    st = members_become(3, "scale in to 2 workers")
    assert added.isdisjoint(x["instance_id"] for x in st["nodes"] if x.get("rank") is not None)
    code, _, err = dlc(kept, capsys, "scale", "--workers", "5")
    assert code == 1 and "above the worker group's maximum 4" in err
    code, _, err = dlc(kept, capsys, "scale", "--workers", "1")
    assert code == 1 and "below the 2 base worker(s)" in err
    assert "dlc scale --status shows the base, minimum, maximum" in err
    master = next(n for n in kept["state"]["nodes"] if n["role"] == "master")
    code, _, err = dlc(kept, capsys, "scale", "--remove", master["address"])
    assert code == 1 and "is the master" in err


def test_connect_and_tunnel_dry_run(kept: dict, capsys) -> None:
    nodes = {n["role"]: n for n in kept["state"]["nodes"] if n["status"] == "running"}
    endpoint = kept["state"]["aws"]["endpoint"]
    code, out, _ = dlc(kept, capsys, "connect", "--dry-run")
    assert code == 0
    assert out.strip() == (f"aws ssm start-session --target {nodes['master']['instance_id']} "
                           f"--region us-east-1 --endpoint-url {endpoint}")
    rank1 = next(n for n in status_json(kept, capsys)["nodes"] if n["rank"] == 1)
    code, out, _ = dlc(kept, capsys, "connect", "1", "--dry-run")
    assert code == 0 and rank1["instance_id"] in out
    code, out, _ = dlc(kept, capsys, "tunnel", "6006", "--node", nodes["worker"]["address"],
                       "--local-port", "16006", "--dry-run")
    assert code == 0 and "--document-name AWS-StartPortForwardingSession" in out
    assert '"portNumber":["6006"],"localPortNumber":["16006"]' in out
    code, _, err = dlc(kept, capsys, "connect", "9", "--dry-run")
    assert code == 3 and "no member of the cluster has rank 9; ranks: 0 " in err
    code, _, err = dlc(kept, capsys, "connect", "i-00000000000000000", "--dry-run")
    assert code == 3 and nodes["master"]["instance_id"] in err


def test_a_dead_node_is_reported_then_replaced(kept: dict, capsys) -> None:
    """Last: a worker's machine dies (its process group is killed). dlc status reports it,
    and, as during the demo, the kept cluster's AWS replaces it: its status check fails,
    Auto Scaling terminates it and launches a replacement, which boots and joins."""
    worker = next(n for n in kept["state"]["nodes"] if n["role"] == "worker"
                  and n["status"] == "running")
    os.killpg(worker["group"]["pid"], signal.SIGKILL)
    for _ in range(120):
        st = status_json(kept, capsys)
        row = next((n for n in st["nodes"] if n["instance_id"] == worker["instance_id"]), None)
        if row is None or not row["healthy"]:
            break
        time.sleep(0.5)
    else:
        raise AssertionError(f"the dead worker still looks healthy: {row}")
    # unreachable while still a member, "not a member" once the master dropped it
    assert row is None or "reachable" in row["health"] or row["health"] == "not a member", row
    # (the master's own row may blink while the membership changes: checked at the end)
    for _ in range(360):
        st = status_json(kept, capsys)
        members = [n for n in st["nodes"] if n["rank"] is not None]
        if len(members) == 3 and worker["instance_id"] not in {n["instance_id"] for n in members} \
                and st["membership"]["healthy"] and all(n["healthy"] for n in members):
            break
        time.sleep(0.5)
    else:
        raise AssertionError(f"the dead worker was never replaced: {st}")
    assert next(n for n in members if n["role"] == "master")["rank"] == 0
    dead = next((n for n in st["nodes"] if n["instance_id"] == worker["instance_id"]), None)
    # on its way out: in the drain hook's Terminating:Wait, or already gone in EC2
    assert dead is None or dead["ec2_state"] in ("shutting-down", "terminated") or \
        str(dead["lifecycle"]).startswith("Terminating"), dead
    code, out, _ = dlc(kept, capsys, "health")
    assert code == 0 and out.strip().endswith("healthy")


def test_stop_lists_what_it_deletes_and_keep_files_keeps_it(kept: dict) -> None:
    """Runs last: it stops the kept cluster (the fixture then only checks nothing is left)."""
    state_path = kept["state_path"]
    work = state_path.parent
    groups = state_groups(state_path)
    keep = demo_stop(state_path, "--keep-files")
    assert keep.returncode == 0, keep.stdout + keep.stderr
    assert f"kept {work}" in keep.stdout and (work / "efs" / "checkpoints").is_dir()
    left = pids_in_groups(groups) | {g for g in groups if alive(g)}
    assert not left, f"processes left behind after --stop: {sorted(left)}"
    gone = demo_stop(state_path)
    assert gone.returncode == 0, gone.stdout + gone.stderr
    said = gone.stdout
    assert f"--stop deletes the work directory {work}" in said
    assert "efs/jobs/" in said and "efs/checkpoints/" in said and "--keep-files" in said
    assert said.index("deletes") < said.index(f"removed {work}")
    assert not work.exists()
