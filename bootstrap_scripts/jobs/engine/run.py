"""The engine's front door: ``run(request, membership, efs) -> Verdict``.

One way to run a job on a set of nodes, whoever asks: ``dl-run --unmanaged`` (from its
options), each attempt of a managed job (the job controller hands the attempt's runner the
job's :class:`RunRequest`) and the health gate's checks and all-reduce. Like TorchElastic's
``LaunchConfig -> elastic_launch -> RunResult``: a typed request in, a typed verdict out.

The steps, each done once here: the launch plan (``launchers``), the nodes' reachability
(``reachability``), publishing the job spec on EFS (written last: the executors' go),
following the job (``watch``), and its result and verdict (``summary``, which classifies
the outcome with ``classify``).
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import sys
import time
from pathlib import Path

from bootstrap_scripts.jobs.engine import checkpoints, image_pull, root_jobs, staging, user_dirs
from bootstrap_scripts.jobs.engine import launchers as ln
from bootstrap_scripts.jobs.engine.classify import Verdict
from bootstrap_scripts.jobs.engine.outcomes import EXIT_USAGE, RunError, say
from bootstrap_scripts.jobs.engine.reachability import check_reachable
from bootstrap_scripts.jobs.engine.summary import summarize
from bootstrap_scripts.jobs.engine.watch import Watch, install_signal_handlers, watch
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.jobs import JobSpec
from bootstrap_scripts.protocol.membership import Membership, Node, build_membership
from bootstrap_scripts.protocol.nnodes import NodeRangeError, check_torchrun_options
from bootstrap_scripts.protocol.paths import ClusterPaths, JobPaths
from bootstrap_scripts.protocol.records import RunnerHeartbeat
from bootstrap_scripts.protocol.run_request import RunRequest, StagingReport
from bootstrap_scripts.protocol.store import OWNER_ONLY


def nodes_membership(m: Membership, nodes: list[Node], *, reason: str,
                     efs_mount: str = "") -> Membership:
    """The membership a run on ``nodes`` (some of ``m``'s) uses: those nodes only, the
    lowest rank first (the master when it is among them: it runs the rendezvous store and
    mpirun), ranks renumbered, the generation, GPU counts and types as ``m`` has them."""
    first = min(nodes, key=lambda n: n.rank)

    def entry(n: Node) -> dict:
        return {"instance_id": n.instance_id, "address": n.address, "gpus": n.gpus,
                "instance_type": n.instance_type, "base": n.base}

    return build_membership(cluster_id=m.cluster_id, generation=m.generation,
                            master=entry(first),
                            workers=[entry(n) for n in nodes if n is not first],
                            efs_mount=efs_mount or m.efs_mount, created_at=m.created_at,
                            reason=reason)


def default_python() -> str:
    return sys.executable if importlib.util.find_spec("torch") else "python3"


def launch_options(request: RunRequest, paths: JobPaths) -> ln.LaunchOptions:
    return ln.LaunchOptions(
        job_id=request.job_id, job_dir=str(paths.dir),
        python=request.python or default_python(), nnodes=request.nnodes,
        nproc_per_node=request.nproc_per_node, max_restarts=request.torchrun_max_restarts,
        rdzv_port=request.rdzv_port, elastic=request.elastic,
        rdzv_last_call=request.rdzv_last_call, mpirun=request.mpirun,
        horovodrun=request.horovodrun, mpi_if_include=request.mpi_if_include,
        mpi_if_exclude=request.mpi_if_exclude, nccl_socket_ifname=request.nccl_socket_ifname,
        mpi_rsh_agent=request.mpi_rsh_agent, mpi_extra=request.mpi_args,
        forward_env=request.forward, allow_run_as_root=os.geteuid() == 0,
        tf_mode=request.tf_mode, tf_port=request.tf_port, mxnet_launch=request.mxnet_launch,
        image=request.image)


def build_plan(request: RunRequest, m: Membership, paths: JobPaths) -> ln.LaunchPlan:
    """The launch plan of ``request`` on ``m``; RunError (usage) naming what is wrong."""
    try:  # the rules dlc submit checks on the laptop too
        check_torchrun_options(request.launcher, request.elastic, request.nnodes)
    except NodeRangeError as exc:
        raise RunError(str(exc), EXIT_USAGE) from None
    try:
        return ln.plan(request.launcher, m, list(request.command),
                       launch_options(request, paths))
    except ln.LaunchError as exc:
        raise RunError(str(exc), EXIT_USAGE) from None


def render_commands(plan: ln.LaunchPlan, m: Membership, env: dict[str, str]) -> str:
    """Human-readable per-node commands (dry run output and ``commands.txt``)."""
    lines = [f"# launcher: {plan.launcher} ({plan.summary})"]
    lines += [f"# job env: {k}={shlex.quote(v)}" for k, v in sorted(env.items())]
    for share in plan.shares:
        node = m.nodes[share.rank]
        lines.append(f"# node {share.rank} {share.address} ({node.role}, {node.gpus} GPU)")
        for proc in share.procs:
            prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(proc.env.items()))
            tag = f"[{proc.label}] " if proc.label else ""
            lines.append(f"{tag}{prefix + ' ' if prefix else ''}{shlex.join(proc.argv)}")
    if plan.master_only:
        others = [n.address for n in m.nodes if n.rank != m.master.rank]
        if others:
            lines.append(f"# reached from the master over ssh: {', '.join(others)}")
    for name, content in sorted(plan.files.items()):
        lines.append(f"# file {name}:")
        lines += [f"#   {line}" for line in content.splitlines()]
    return "\n".join(lines) + "\n"


def announce(request: RunRequest, plan: ln.LaunchPlan, m: Membership) -> None:
    say(f"job {request.job_id}")
    say(f"launcher: {plan.summary}")
    say("nodes: " + ", ".join(f"{n.rank}={n.address}{' (master)' if n.role == 'master' else ''}"
                              for n in m.nodes) + f" (membership generation {m.generation})")


def prepare(request: RunRequest, m: Membership, efs: Path
            ) -> tuple[ln.LaunchPlan, JobPaths, str]:
    """The plan, the job's paths and its rendered commands (what a dry run prints)."""
    paths = ClusterPaths(efs).job(request.job_id)
    plan = build_plan(request, m, paths)
    return plan, paths, render_commands(plan, m, request.env)


def stage_data(request: RunRequest, m: Membership, efs: Path, sign: root_jobs.Sign | None = None
               ) -> tuple[StagingReport | None, Verdict | None]:
    """``--data``: the staging job on every node first (``staging``); its report, or the
    verdict of a staging that failed (the job then never starts)."""
    stage = staging.stage_request(request, m)
    say(f"staging {request.data} on every node ({stage.job_id})")
    started = time.monotonic()
    with staging.cancel_forwarded(ClusterPaths(efs).job(request.job_id),
                                  ClusterPaths(efs).job(stage.job_id)):
        verdict = run(stage, m, efs, sign)
    if verdict.status != "succeeded":
        say(f"job {request.job_id} not started: staging {request.data} {verdict.status}")
        return None, verdict
    report = staging.report(request, m, ClusterPaths(efs).job(stage.job_id),
                            time.monotonic() - started)
    staging.announce(report)
    return report, None


def pull_image(request: RunRequest, m: Membership, efs: Path,
               sign: root_jobs.Sign | None = None) -> Verdict | None:
    """``--image``: its pull job on every node first (``image_pull``); None when every node
    has the image, else the verdict of the pull (the job then never starts: infrastructure,
    naming the nodes and causes)."""
    pull = image_pull.pull_request(request)
    say(f"pulling {request.image} on every node ({pull.job_id})")
    with staging.cancel_forwarded(ClusterPaths(efs).job(request.job_id),
                                  ClusterPaths(efs).job(pull.job_id)):
        verdict = run(pull, m, efs, sign)
    if verdict.status != "succeeded":
        say(f"job {request.job_id} not started: pulling its image {verdict.status}")
        return verdict
    return None


def checkpoint_step(request: RunRequest, sub: RunRequest, m: Membership, efs: Path,
                    sign: root_jobs.Sign | None = None) -> Verdict:
    """A restore or flush job of ``request`` (``checkpoints``) on its first node. A cancel
    of the job cancels its restore; the flush after it runs all the same (it is short)."""
    one = nodes_membership(m, checkpoints.first_node(m), reason=sub.job_id)
    if sub.job_id.endswith(checkpoints.FLUSH_SUFFIX):
        return run(sub, one, efs, sign)
    with staging.cancel_forwarded(ClusterPaths(efs).job(request.job_id),
                                  ClusterPaths(efs).job(sub.job_id)):
        return run(sub, one, efs, sign)


def run(request: RunRequest, m: Membership, efs: Path, sign: root_jobs.Sign | None = None
        ) -> Verdict:
    """Run ``request`` on the nodes of ``m`` (EFS at ``efs``) and follow it to its end.

    With a checkpoint mirror or ``--resume-from`` (``checkpoints``): the newest complete
    checkpoint is restored first, mirrored while the job runs and once more after it.
    ``sign``: root's signer on the master (``root_jobs``): every spec published is signed.
    With ``--image``, the image is pulled on every node before anything else runs."""
    if request.image:
        if os.geteuid() == 0:  # dl-container refuses root on every node: say it once here
            raise RunError("--image runs every rank as the job's own user (rootless podman), "
                           "never as root: run the job as a cluster user", EXIT_USAGE)
        prepare(request, m, efs)  # a bad plan fails before the pull, as it would without
        if (failed := pull_image(request, m, efs, sign)) is not None:
            return failed
    if not checkpoints.wanted(request):
        return run_job(request, m, efs, sign)
    prepare(request, m, efs)  # a bad plan fails before the restore, as it would without
    restored = checkpoint_step(request, checkpoints.restore_request(request), m, efs,
                               sign)
    if restored.status != "succeeded":
        say(f"job {request.job_id} not started: restoring its checkpoint {restored.status} "
            f"(logs: {ClusterPaths(efs).job(request.job_id + checkpoints.RESTORE_SUFFIX).nodes})")
        return restored
    verdict = run_job(request, m, efs, sign)
    flush = checkpoints.flush_request(request)
    if flush is not None:
        flushed = checkpoint_step(request, flush, m, efs, sign)
        if flushed.status != "succeeded":
            say(f"job {request.job_id}: the last mirror pass {flushed.status} (logs: "
                f"{ClusterPaths(efs).job(flush.job_id).nodes})")
    return verdict


def run_job(request: RunRequest, m: Membership, efs: Path, sign: root_jobs.Sign | None = None
            ) -> Verdict:
    """Run ``request`` itself (after any restore) and follow it to its end.

    RunError before anything was published (a bad plan, an unreachable node: nothing to
    stop); once the spec is out, signals cancel the job on every node and the verdict says
    so. With ``request.data`` the data is staged on every node first."""
    plan, paths, commands = prepare(request, m, efs)
    if request.checkpoint_url:
        plan, request = checkpoints.with_mirror(plan, request)
        commands = render_commands(plan, m, request.env)
    staged = None
    if request.data:
        staged, failed = stage_data(request, m, efs, sign)
        if failed is not None:
            return failed
        assert staged is not None
        plan, request = staging.with_data_dir(plan, staged, request)
        commands = render_commands(plan, m, request.env)
    announce(request, plan, m)
    check_reachable(efs, [s.address for s in plan.shares],
                    timeout=request.heartbeat_timeout, reach_timeout=request.reach_timeout)
    if paths.dir.exists():
        raise RunError(f"job directory {paths.dir} already exists: choose another --job-id",
                       EXIT_USAGE)
    say(f"logs: {paths.nodes}/")
    try:  # in the caller's own jobs/<user>/, made by root: never one of someone else's
        user_dirs.own_dir(paths.dir.parent.parent)
        paths.nodes.mkdir(parents=True)
    except user_dirs.UserDirError as exc:
        raise RunError(str(exc), EXIT_USAGE) from None
    except PermissionError as exc:
        raise RunError(f"cannot create the job directory {paths.dir} ({exc.strerror})",
                       EXIT_USAGE) from None
    if staged is not None:
        store.write_record(paths.staging, staged)
    for name, content in plan.files.items():
        store.atomic_write(paths.dir / name, content)
    # The spec and the rendered commands carry the job's --env values: the owner's alone
    # (the root executors read them all the same).
    store.atomic_write(paths.commands, commands, mode=OWNER_ONLY)
    store.write_record(paths.runner_heartbeat,
                       RunnerHeartbeat(seq=0, pid=os.getpid(), time=time.time()))
    spec = JobSpec(
        job_id=request.job_id, launcher=plan.launcher, shares=plan.shares, env=request.env,
        cwd=request.cwd or os.getcwd(), created_at=time.time(),
        grace_seconds=request.grace, orphan_timeout=request.orphan_timeout,
        master_only=plan.master_only, elastic=request.elastic, generation=m.generation,
        join_template=plan.join_template,
        join_admission=request.elastic and request.join_admission, mounts=request.mounts,
        nnodes=plan.nnodes,
    )
    spec_text = spec.to_json()
    try:  # root's spec: the master's signature first (root_jobs)
        root_jobs.sign_before(paths.spec, spec_text, sign)
    except root_jobs.RootJobError as exc:  # nothing ran: leave no half job behind
        shutil.rmtree(paths.dir, ignore_errors=True)
        raise RunError(str(exc), EXIT_USAGE) from None
    w = Watch(spec, paths, efs, request)
    old = install_signal_handlers(w)
    store.atomic_write(paths.spec, spec_text, mode=OWNER_ONLY)  # the go: written last
    return summarize(watch(w, old))
