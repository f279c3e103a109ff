"""How the engine wires a job's checkpoints to S3: the restore and flush jobs on the first
node, the mirror as a helper of its share, the controller's URL per user and job, and
``--resume-from`` validated naming the bad value."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from bootstrap_scripts.jobs.cli.dl_run import build_parser
from bootstrap_scripts.jobs.cli.request_args import request_from_args
from bootstrap_scripts.jobs.controller import attempts
from bootstrap_scripts.jobs.controller.entry import parse_args as controller_args
from bootstrap_scripts.jobs.engine import checkpoints
from bootstrap_scripts.jobs.engine.outcomes import RunError
from bootstrap_scripts.jobs.engine.plan_types import LaunchPlan
from bootstrap_scripts.protocol.errors import ProtocolError
from bootstrap_scripts.protocol.jobs import Proc, Share
from bootstrap_scripts.protocol.managed_records import ManagedRequest
from bootstrap_scripts.protocol.membership import build_membership
from bootstrap_scripts.protocol.run_request import RunRequest

BASE = "s3://ck-bucket/checkpoints/c1/"


def membership(n: int = 3):
    nodes = [{"instance_id": f"i-{k}", "address": f"127.20.0.{k + 1}", "gpus": 0}
             for k in range(n)]
    return build_membership(cluster_id="c1", generation=1, efs_mount="/efs", master=nodes[0],
                            workers=nodes[1:], reason="test")


def request(**kw) -> RunRequest:
    return RunRequest(job_id="train-1.1", command=("python", "t.py"),
                      env={"DL_CHECKPOINT_DIR": "/efs/checkpoints/alice/train-1"}, **kw)


def test_the_controller_mirrors_each_users_job_under_its_own_prefix() -> None:
    managed = ManagedRequest(job_id="train-1", submitted_at=1.0, run=RunRequest(
        job_id="train-1", command=("t",), resume_from="s3://old-bucket/checkpoints/c0/alice/j/"))
    run = attempts.attempt_request(managed, attempt_id="train-1.1", efs=Path("/efs"),
                                   restart_count=0, user="alice", checkpoints_url=BASE)
    assert run.checkpoint_url == BASE + "alice/train-1/"
    assert run.env["DL_CHECKPOINT_DIR"] == "/efs/checkpoints/alice/train-1"
    assert run.resume_from == "s3://old-bucket/checkpoints/c0/alice/j/"
    plain = attempts.attempt_request(managed, attempt_id="train-1.1", efs=Path("/efs"),
                                     restart_count=0, user="alice")
    assert plain.checkpoint_url == ""
    with pytest.raises(SystemExit):
        controller_args(["--checkpoint-url", "http://x/"])


def test_restore_and_flush_run_the_tool_once_on_the_first_node() -> None:
    r = request(checkpoint_url=BASE + "alice/train-1/", resume_from="s3://old-b/p/")
    assert checkpoints.wanted(r)
    restore = checkpoints.restore_request(r)
    assert restore.job_id == "train-1.1.restore" and restore.launcher == "each"
    assert restore.command[1:] == (
        "-m", checkpoints.MODULE, "restore", "--dir", "/efs/checkpoints/alice/train-1",
        "--url", BASE + "alice/train-1/", "--from", "s3://old-b/p/")
    assert not restore.checkpoint_url and not restore.resume_from  # no restore of a restore
    flush = checkpoints.flush_request(r)
    assert flush is not None and flush.command[3] == "once"
    assert flush.job_id == "train-1.1.flush"
    assert [n.rank for n in checkpoints.first_node(membership())] == [0]
    only_resume = request(resume_from="s3://old-b/p/")
    assert checkpoints.flush_request(only_resume) is None  # nothing to mirror to
    assert checkpoints.restore_request(only_resume).command[-2:] == ("--url", "s3://old-b/p/")
    assert not checkpoints.wanted(request())


def test_the_mirror_is_a_helper_of_the_first_share_only() -> None:
    r = request(checkpoint_url=BASE + "alice/train-1/")
    shares = tuple(Share(k, f"127.20.0.{k + 1}", (Proc(argv=("x",)),)) for k in (1, 0, 2))
    plan, req = checkpoints.with_mirror(LaunchPlan("torchrun", shares, False), r)
    helpers = {s.rank: [p for p in s.procs if p.label == checkpoints.MIRROR_LABEL]
               for s in plan.shares}
    assert [len(helpers[k]) for k in (0, 1, 2)] == [1, 0, 0]
    (helper,) = helpers[0]
    assert not helper.wait and helper.argv[3] == "watch"
    assert req.env["DL_CHECKPOINT_URL"] == BASE + "alice/train-1/"
    assert "DL_CHECKPOINT_URL" in req.forward


@pytest.mark.parametrize("bad", ["s3:/bucket/p", "bucket/p", "s3://Bad_Bucket/p",
                                 "s3://bucket/../p"])
def test_a_bad_resume_from_is_refused_naming_the_value(bad: str) -> None:
    args = build_parser().parse_args(["--resume-from", bad])
    with pytest.raises(ProtocolError, match=re.escape(f"--resume-from {bad!r}")):
        request_from_args(args, ["python", "t.py"], "j")


def test_resume_from_needs_a_checkpoint_directory() -> None:
    r = RunRequest(job_id="j", command=("t",), resume_from="s3://old-b/p/")
    with pytest.raises(RunError, match="needs a checkpoint directory"):
        checkpoints.wanted(r)


def test_dl_jobs_shows_where_the_last_complete_checkpoint_is(tmp_path, capsys) -> None:
    import json
    import pwd

    from bootstrap_scripts.data import checkpoint_mirror, checkpoint_plan
    from bootstrap_scripts.jobs.cli import dl_jobs
    from bootstrap_scripts.jobs.engine import managed
    from bootstrap_scripts.protocol.managed_records import ManagedJob
    from bootstrap_scripts.protocol.paths import ClusterPaths

    user = pwd.getpwuid(os.geteuid()).pw_name
    paths = ClusterPaths(tmp_path).managed("ck-1")
    paths.dir.mkdir(parents=True)
    paths.request.write_text("{}")
    managed.save_job(paths, ManagedJob(job_id="ck-1", user=user, state="running"))
    ckdir = ClusterPaths(tmp_path).user_checkpoints(user) / "ck-1"
    ckdir.mkdir(parents=True)
    assert dl_jobs.main(["--mount-point", str(tmp_path), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["jobs"][0]
    assert listed["checkpoint"] == {"efs": "", "s3": ""}
    (ckdir / "step-000007.pt").write_bytes(b"1234")
    (ckdir / "step-000009.pt").write_bytes(b"12")  # no manifest: not complete
    m = checkpoint_plan.new_manifest("step-000007", 7, 1.0, [("step-000007.pt", 4)])
    (ckdir / m.manifest_file).write_text(m.render())
    checkpoint_mirror.write_status(ckdir, BASE + f"{user}/ck-1/", m)
    assert dl_jobs.main(["--mount-point", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "step-000007 (efs, s3)" in out and "step-000009" not in out
    assert dl_jobs.main(["--mount-point", str(tmp_path), "show", "ck-1"]) == 0
    out = capsys.readouterr().out
    assert f"checkpoint:   {ckdir}/step-000007.manifest.json" in out
    assert f"mirrored:     {BASE}{user}/ck-1/step-000007.manifest.json" in out


def test_the_restart_record_reads_the_newest_complete_manifest(tmp_path) -> None:
    """A checkpoint fetched from S3 comes with its manifest but no ``latest.json``: the
    controller's record of where a restart resumed from reads the manifest's meta."""
    from bootstrap_scripts.data import checkpoint_plan

    assert checkpoints.checkpoint_position(tmp_path) == (None, None)
    (tmp_path / "latest.json").write_text('{"epoch": 1, "step": 5}')
    assert checkpoints.checkpoint_position(tmp_path) == (1, 5)
    (tmp_path / "epoch-0002.pt").write_bytes(b"12")
    m = checkpoint_plan.new_manifest("epoch-0002", 46, 1.0, [("epoch-0002.pt", 2)],
                                     {"epoch": 2, "step": 23})
    (tmp_path / m.manifest_file).write_text(m.render())
    assert checkpoints.checkpoint_position(tmp_path) == (2, 23)
