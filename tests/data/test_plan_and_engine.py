"""The pure parts of dl-run --data: the source parser, the copy plan (skip / fetch / stale /
shards), the disk choice, and how the engine turns a request into its staging job and tells
each rank where the data is."""

from __future__ import annotations

import dataclasses

import pytest

from bootstrap_scripts.data import stage as stage_module
from bootstrap_scripts.data.disks import Mount, choose_disk
from bootstrap_scripts.data.plan import S3Object, StageError, plan_copy
from bootstrap_scripts.jobs.cli.dl_run import build_parser
from bootstrap_scripts.jobs.cli.request_args import request_from_args
from bootstrap_scripts.jobs.engine import staging
from bootstrap_scripts.jobs.engine.outcomes import RunError
from bootstrap_scripts.jobs.engine.plan_types import LaunchPlan
from bootstrap_scripts.protocol.data_source import DataSource, parse_data_source
from bootstrap_scripts.protocol.errors import ProtocolError
from bootstrap_scripts.protocol.jobs import Proc, Share
from bootstrap_scripts.protocol.membership import build_membership
from bootstrap_scripts.protocol.run_request import RunRequest, StagedNode, StagingReport


@pytest.mark.parametrize(("text", "expected"), [
    ("s3://b-1/digits", DataSource("b-1", "digits/")),
    ("s3://b-1/digits/", DataSource("b-1", "digits/")),
    ("s3://b-1", DataSource("b-1", "")),
    ("s3://b-1/a/b:/scratch/data/", DataSource("b-1", "a/b/", "/scratch/data")),
])
def test_sources_parse(text: str, expected: DataSource) -> None:
    assert parse_data_source(text) == expected


@pytest.mark.parametrize("text", ["b/digits", "s3://B/x", "s3://b-1/x:relative",
                                  "s3://b-1/../x", "s3://b-1/a//b", "s3://b-1/x:/a/../b"])
def test_bad_sources_are_refused_when_the_request_is_built(text: str) -> None:
    with pytest.raises(ProtocolError, match="data"):
        RunRequest(job_id="j", command=("true",), data=text)


def objs(*keys: str, size: int = 5, etag: str = "e") -> list[S3Object]:
    return [S3Object(k, size, etag) for k in keys]


def test_the_plan_fetches_only_what_is_missing_or_changed_and_drops_what_left() -> None:
    listing = [*objs("ds/a", "ds/b", "ds/c", "ds/sub/", "other/x"), S3Object("ds/d", 5, "new")]
    known = {"ds/a": (5, "e"), "ds/b": (5, "e"), "ds/d": (5, "old"), "ds/gone": (3, "e")}
    present = {"a": 5, "b": 4, "d": 5}  # b was cut short on disk
    plan = plan_copy(listing, "ds/", known, lambda rels: {r: present[r] for r in rels.values()
                                                          if r in present})
    assert [o.rel for o in plan.wanted] == ["a", "b", "c", "d"]  # no folder marker, no other/
    assert [o.key for o in plan.fetch] == ["ds/b", "ds/c", "ds/d"]
    assert plan.stale == ["gone"]


def test_shards_cover_every_object_once() -> None:
    listing = objs(*(f"p/{i:02d}" for i in range(11)))
    shards = [plan_copy(listing, "p/", {}, lambda r: {}, rank=r, count=4) for r in range(4)]
    keys = [o.key for s in shards for o in s.wanted]
    assert sorted(keys) == sorted(o.key for o in listing) and len(set(keys)) == 11
    with pytest.raises(StageError, match="rank 4 is not one of the 4 shard"):
        plan_copy(listing, "p/", {}, lambda r: {}, rank=4, count=4)


def mount(point: str, store: bool, free: int, writable: bool = True) -> Mount:
    return Mount(f"/dev/{point.strip('/').replace('/', '-')}", point, store, free, writable)


def test_the_disk_choice_prefers_the_largest_writable_instance_store_under_the_root() -> None:
    mounts = [mount("/", False, 10**12), mount("/opt/dlami/nvme", True, 10**11),
              mount("/mnt/big", True, 10**13, writable=False), mount("/scratch", True, 10**12)]
    assert choose_disk(mounts, "/")[0] == "/scratch"
    assert choose_disk(mounts[:2], "/") == ("/opt/dlami/nvme", "instance-store NVMe "
                                            "/dev/opt-dlami-nvme")
    assert choose_disk([mount("/", False, 10**12)], "/")[0] == "/var/tmp"
    # an emulated node (root /tmp/n1) ignores the host's mounts
    assert choose_disk(mounts, "/tmp/n1")[0] == "/tmp/n1/var/tmp"


def membership(n: int = 2):
    nodes = [{"instance_id": f"i-{k}", "address": f"127.20.0.{k + 1}", "gpus": 0}
             for k in range(n)]
    return build_membership(cluster_id="c", generation=1, efs_mount="/efs", master=nodes[0],
                            workers=nodes[1:], reason="test")


def test_the_staging_job_runs_the_stager_once_per_node_as_the_same_request() -> None:
    args = build_parser().parse_args(["--data", "s3://b-1/ds", "--data-shard", "--env", "A=1"])
    request = request_from_args(args, ["python", "train.py"], "train-1")
    stage = staging.stage_request(request, membership(3))
    assert stage.job_id == "train-1.stage" and stage.launcher == "each"
    assert stage.command[1:] == ("-m", "bootstrap_scripts.data.stage", "s3://b-1/ds",
                                 "--shard-count", "3", "--checksums", "warn")
    assert stage.env["A"] == "1" and stage.cwd == "/" and not stage.data
    # the job's checkpoint restore and mirror are around the job, not its staging job
    mirrored = dataclasses.replace(request, checkpoint_url="s3://ck-bucket/c/u/j/",
                                   resume_from="s3://old-bucket/c/u/j/")
    staged = staging.stage_request(mirrored, membership(3))
    assert (staged.checkpoint_url, staged.resume_from) == ("", "")
    with pytest.raises(RunError, match="--data does not go with --elastic"):
        staging.stage_request(RunRequest(job_id="j", command=("t",), data="s3://b-1/x",
                                         elastic=True), membership())
    with pytest.raises(RunError, match="--data-shard shards what --data stages"):
        request_from_args(build_parser().parse_args(["--data-shard"]), ["t"], "j")


def test_data_checksums_travels_from_dl_run_to_the_stager(capsys) -> None:
    """``dl-run --data-checksums required``: in the run request (what a managed job's
    request.json carries to every attempt), then in the staging job's stager command, as
    the stager's own parser reads it; the staging job itself carries no data options."""
    args = build_parser().parse_args(["--data", "s3://b-1/ds", "--data-checksums",
                                      "required"])
    request = request_from_args(args, ["python", "train.py"], "train-1")
    assert type(request).from_json(request.to_json()).data_checksums == "required"
    job = staging.stage_request(request, membership(2))
    assert job.command[3:] == ("s3://b-1/ds", "--checksums", "required")
    assert job.data_checksums == "warn"
    assert stage_module.parse_args(list(job.command[3:])).checksums == "required"

    with pytest.raises(SystemExit):
        build_parser().parse_args(["--data", "s3://b-1/ds", "--data-checksums", "maybe"])
    assert "--data-checksums: invalid choice: 'maybe'" in capsys.readouterr().err
    with pytest.raises(RunError, match="--data-checksums required checks what --data "
                                       "stages: give --data too"):
        request_from_args(build_parser().parse_args(["--data-checksums", "required"]),
                          ["t"], "j")
    with pytest.raises(ProtocolError, match="--data-checksums must be one of warn, "
                                            "required, got 'maybe'"):
        RunRequest(job_id="j", command=("t",), data="s3://b-1/x", data_checksums="maybe")


def report(*dirs: str) -> StagingReport:
    return StagingReport(job_id="j", source="s3://b-1/ds/", seconds=1.0, nodes=tuple(
        StagedNode(rank=k, address=f"127.20.0.{k + 1}", directory=d, objects=1, copied=1,
                   bytes=5, copied_bytes=5, seconds=0.5, gbps=0.0) for k, d in enumerate(dirs)))


def plan_of(master_only: bool, n: int = 2) -> LaunchPlan:
    shares = tuple(Share(k, f"127.20.0.{k + 1}", (Proc(argv=("x",)),))
                   for k in range(1 if master_only else n))
    return LaunchPlan("mpi" if master_only else "torchrun", shares, master_only)


def test_every_rank_learns_its_nodes_data_directory() -> None:
    request = RunRequest(job_id="j", command=("t",), data="s3://b-1/ds")
    plan, req = staging.with_data_dir(plan_of(False), report("/n0/d", "/n1/d"), request)
    assert [s.procs[0].env["DL_DATA_DIR"] for s in plan.shares] == ["/n0/d", "/n1/d"]
    assert "DL_DATA_DIR" not in req.env
    plan, req = staging.with_data_dir(plan_of(True), report("/d", "/d"), request)
    assert req.env["DL_DATA_DIR"] == "/d" and "DL_DATA_DIR" in req.forward
    with pytest.raises(RunError, match=r"different directories.*--data s3://b-1/ds:/local/dir"):
        staging.with_data_dir(plan_of(True), report("/n0/d", "/n1/d"), request)


def test_a_node_without_a_result_line_fails_the_staging(tmp_path) -> None:
    from bootstrap_scripts.protocol.paths import ClusterPaths

    paths = ClusterPaths(tmp_path).job("j.stage")
    paths.nodes.mkdir(parents=True)
    paths.log(0).write_text('dl-stage: ...\nDL_STAGE_RESULT {"directory": "/d", "objects": 1, '
                            '"copied": 1, "bytes": 5, "copied_bytes": 5, "seconds": 0.1, '
                            '"gbps": 0.1}\n')
    paths.log(1).write_text("dl-stage: interrupted\n")
    request = RunRequest(job_id="j", command=("t",), data="s3://b-1/ds")
    with pytest.raises(RunError, match=r"node rank\(s\) \[1\] reported no result"):
        staging.report(request, membership(), paths, 1.0)
    paths.log(1).write_text(paths.log(0).read_text())
    assert [n.directory for n in staging.report(request, membership(), paths, 1.0).nodes] == [
        "/d", "/d"]


def test_cancelling_the_job_while_it_stages_cancels_the_staging(tmp_path) -> None:
    import time

    from bootstrap_scripts.protocol.paths import ClusterPaths

    job, stage = ClusterPaths(tmp_path).job("j"), ClusterPaths(tmp_path).job("j.stage")
    stage.dir.mkdir(parents=True)
    with staging.cancel_forwarded(job, stage, poll=0.05):
        time.sleep(0.2)
        assert not stage.cancel.exists()
        job.dir.mkdir()
        job.cancel.write_text("cancelled by the job controller\n")  # what the controller does
        deadline = time.monotonic() + 5
        while not stage.cancel.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    assert stage.cancel.read_text() == "cancelled by the job controller\n"
