"""One demo run from start to teardown, the training job it runs with ``dl-run``, and
``--stop`` for a cluster ``--keep`` left running.

Whatever happens (a clear failure, a bug, Ctrl-C) the run ends the same way: every process
group it started is stopped and checked gone, the report is written, and the temp work dir
is removed unless the cluster is kept.
"""

from __future__ import annotations

import contextlib
import json
import math
import queue
import shutil
import subprocess
import threading
import time
from pathlib import Path

from rich.markup import escape

from bootstrap_scripts.agent import imds_guard
from bootstrap_scripts.node.procgroup import (
    Tracked,
    descendants,
    pids_in_groups,
    start_time,
    stop_groups,
)
from emulator import deploy as dp
from emulator import slurm_node
from emulator.demo import (
    cluster,
    frameworks,
    joblog,
    keeper,
    recovery,
    report,
    scenarios,
    signals,
    slurm,
)
from emulator.demo import data as demo_data
from emulator.demo.context import BIN_DIR, DemoContext, DemoError, free_port
from emulator.demo.joblog import JobRun
from emulator.nodes import base_env
from emulator.units import NodeError

#: The example job's global batch (rounded to a multiple of every world size in play).
TARGET_BATCH = 64
#: How long the job controller waits for Auto Scaling's replacement of a failed node before
#: it restarts on the survivors (``dl-run --replace-timeout``): the emulator replaces a node
#: in seconds, so a replacement that did not come in this time is a failure worth seeing.
REPLACE_TIMEOUT_S = 120


def global_batch(worlds: list[int], target: int = TARGET_BATCH) -> int:
    """A global batch every world size in play divides (the example keeps it fixed)."""
    lcm = 1
    for w in worlds:
        lcm = lcm * w // math.gcd(lcm, w)
    return lcm * max(1, round(target / lcm))


class Demo(DemoContext):
    # -- the training job --------------------------------------------------------------------
    def run_job(self, *, world_sizes: list[int],
                scenario: scenarios.Scenario | None = None) -> JobRun:
        """``dl-run`` the example on the master (the job controller runs it and restarts it
        after faults), following its output line by line; a ``scenario`` sees every line
        and acts on time while the job runs."""
        master = self.master()
        if master is None:
            raise DemoError("no live master node to run the job on")
        dl_run = master.root / BIN_DIR / "dl-run"
        port = free_port(master.address)
        train = ["python", "-m", "bootstrap_scripts.examples.train_digits", "--epochs",
                 str(self.ns.epochs), "--require-acc", str(self.ns.require_acc),
                 "--global-batch-size", str(global_batch(world_sizes))]
        if scenario is not None:
            # checkpoint often and stretch the steps a little: the training itself takes only
            # ~0.2 s per epoch, and it must still be running when nodes join, leave or die
            train += ["--checkpoint-every", "4", "--step-delay", str(scenarios.STEP_DELAY)]
        if isinstance(scenario, scenarios.ElasticScenario | recovery.Recovery):
            train += scenario.train_args()
        if self.ns.elastic:
            train[train.index("--global-batch-size") + 1] = str(TARGET_BATCH)  # any world
        launch = ["--rdzv-port", str(port)]
        if self.ns.framework == "tf":
            train[2] = frameworks.TF_EXAMPLE
            launch = frameworks.tf_job_args(port)
        launch += demo_data.dl_run_args(self.ns)
        argv = [str(dl_run), "--root", str(master.root), *launch,
                "--heartbeat-timeout", "4", "--fail-grace", "3", "--grace", "3",
                "--replace-timeout", str(REPLACE_TIMEOUT_S),
                *(["--elastic", "--grace", "10"] if self.ns.elastic else []), "--", *train]
        self.step(f"running the example job with dl-run on the master: {' '.join(train)}")
        return self.follow_job(argv, JobRun(), scenario, "dl-run")

    def attach_job(self, job_id: str, scenario: scenarios.Scenario | None = None) -> JobRun:
        """``dl-jobs logs ID -f`` on the (new) master, as a user re-attaches to a job."""
        master = self.master()
        if master is None:
            raise DemoError(f"no live master node to follow job {job_id} on")
        argv = [str(master.root / BIN_DIR / "dl-jobs"), "--root", str(master.root), "logs",
                job_id, "-f"]
        self.step(f"re-attaching on the new master {master.address}: dl-jobs logs {job_id} -f")
        res = JobRun(resumed=True, managed_id=job_id, job_id=job_id, how="dl-jobs logs -f")
        return self.follow_job(argv, res, scenario, "dl-jobs")

    def follow_job(self, argv: list[str], res: JobRun, scenario: scenarios.Scenario | None,
                   name: str) -> JobRun:
        """Run ``argv`` (a follower of the job's output), line by line, until it exits; the
        emulated Auto Scaling acts meanwhile."""
        t = time.monotonic()
        p = subprocess.Popen(argv, cwd=dp.REPO_ROOT, env=base_env(self.aws), text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True)
        tracked = Tracked(name, p.pid, start_time(p.pid))
        self.runners.append(tracked)
        self.save_state()
        lines: queue.Queue[str | None] = queue.Queue()

        def reader() -> None:
            for line in p.stdout:  # type: ignore[union-attr]
                lines.put(line.rstrip("\n"))
            lines.put(None)

        threading.Thread(target=reader, daemon=True).start()
        out_log = open(self.logs / f"dl-run-{len(self.jobs) + 1}.log", "w")  # noqa: SIM115
        first_epoch_at: float | None = None
        with out_log:
            while True:
                try:
                    line = lines.get(timeout=0.2)
                except queue.Empty:
                    line = ""
                if line is None:
                    break
                if line:
                    if scenario is not None:
                        scenario.on_line(line, res)
                    out_log.write(line + "\n")
                    res.keep_line(line)
                    self.show_job_line(line, res)
                    if first_epoch_at is None and res.epochs:
                        first_epoch_at = time.monotonic()
                if scenario is not None and first_epoch_at:
                    scenario.on_tick(res, first_epoch_at)
                if self.autoscaling is not None:
                    self.autoscaling.tick()
        res.finish(p.wait(), time.monotonic() - t)
        for held in res.release_errors():  # the last attempt's errors: the user needs them
            self.info(f"[dim]{escape(held)}[/]")
        self.runners.remove(tracked)
        self.jobs.append(res)
        return res

    def show_job_line(self, line: str, res: JobRun) -> None:
        if (managed_id := joblog.submitted(line)) is not None:
            res.job_id = res.managed_id = managed_id
            self.info(f"job {res.job_id} (managed by the job controller)")
        elif (rec := joblog.restart(line)) is not None:
            res.restart_lines.append({**rec, "seen": time.monotonic()})
            held = res.release_errors()
            if held:  # the ended attempt's survivors, stopped by the fault: the restart says why
                self.info(f"[dim]({len(held)} error line(s) of the ended attempt, from the "
                          f"ranks that lost their peer: {self.logs}/dl-run-*.log)[/]")
            self.info(f"[yellow]{escape(line)}[/]")
        elif (job_id := joblog.job_id(line)) is not None:
            if not res.managed_id:
                res.job_id = job_id
                self.info(f"job {res.job_id}")
        elif (rec := joblog.epoch(line)) is not None:
            rec["attempt"] = len(res.restart_lines) + 1
            rec["seen"] = round(time.monotonic() - self.t0, 2)
            res.epochs.append(rec)
            res.world_size = rec["world_size"]
            self.info(f"epoch {rec['epoch']:3}/{self.ns.epochs}  acc {rec['acc']:.3f}  "
                      f"loss {rec['loss']:.4f}  {rec['samples_per_s']:6} samples/s  "
                      f"world size {rec['world_size']}")
        elif (acc := joblog.final_acc(line)) is not None:
            res.final_acc = acc
        elif joblog.is_runner_notice(line):
            self.info(escape(line) if "succeeded" in line else f"[yellow]{escape(line)}[/]")
        elif joblog.is_detail(line):
            if any(w in line for w in joblog.SHOWN_AT_ONCE):
                self.info(f"[dim]{escape(line)}[/]")
            else:
                res.hold_error(line)

    # -- teardown ----------------------------------------------------------------------------
    def teardown(self) -> tuple[list[int], list[int]]:
        """Stop everything; returns (survivors, every PID that was running at the start)."""
        groups = self.groups()
        members = pids_in_groups(g.pid for g in groups)
        seen = sorted(members | descendants(members))
        left_slurm = slurm.stop_daemons(self)  # before the groups: slurmstepd left them
        survivors = stop_groups(groups, grace=15) | left_slurm
        slurm.cleanup(self)
        for n in self.nodes:
            for p in n.popens:
                with contextlib.suppress(Exception):
                    p.wait(timeout=1)
            n.forget_kernel_rules()
            if n.status == "running":
                n.status = "stopped"
        if self.cloud_popen is not None:
            with contextlib.suppress(Exception):
                self.cloud_popen.wait(timeout=5)
        return sorted(survivors), seen

    # -- main flow ---------------------------------------------------------------------------
    def play(self) -> JobRun:
        """Bring the cluster up and train; the job that must have succeeded."""
        ns = self.ns
        from emulator.demo import capacity  # --capacity-out / --context

        cluster.check_install(self)
        if getattr(ns, "acc_note", ""):
            self.info(ns.acc_note)
        if ns.framework == "tf":
            frameworks.ensure_tensorflow(self)
        if slurm.wanted(ns):
            slurm.prepare(self)  # before the deploy: a work dir Slurm cannot use stops here
        cluster.start_cloud(self)
        if ns.data:
            demo_data.upload(self)
        cluster.deploy(self, {**scenarios.deploy_context(ns), **capacity.deploy_context(self),
                              **demo_data.deploy_context(ns), **slurm.deploy_context(ns)})
        scenarios.fail_launches(self)
        scenarios.enforce_iam(self)  # --enforce-iam: from here on IAM decides every call
        cluster.boot_nodes(self)
        cluster.notify_launches(self)
        capacity.settle(self)  # launch errors reach the Lambda; moved groups refill and boot
        cluster.form_cluster(self)
        world = len(self.membership.nodes)
        # From here on AWS acts by itself: unhealthy instances are replaced, new instances
        # boot, lost machines fail their status checks (emulator.autoscaling).
        self.autoscaling = self.autoscaling or cluster.autoscaling(self)
        if slurm.wanted(ns):
            job = slurm.run_job(self, self.show_job_line)
            self.jobs.append(job)
        elif recovery.wanted(ns):
            drill = recovery.Recovery(self)
            job = drill.finish(self.run_job(world_sizes=[world], scenario=drill))
        else:
            elastic = scenarios.ElasticScenario(self) if ns.elastic else None
            job = self.run_job(world_sizes=[world], scenario=elastic)
            if elastic is not None:
                elastic.finish(job)  # what was asked for happened, or DemoError says what not
        return job

    def run(self) -> int:
        """Play the demo, then tear down on every way out: success, a failure, a bug, Ctrl-C,
        SIGTERM or SIGHUP (a closed terminal), or a reader that went away (``| tee`` stopped
        by the same Ctrl-C: see :class:`emulator.demo.signals.PipeSafeStream`). Signals that
        end the run become ``KeyboardInterrupt`` while playing and are ignored while tearing
        down, so a second Ctrl-C cannot leave half the cluster running."""
        try:
            with signals.interrupting():
                status, code, error = self.play_and_judge()
        except KeyboardInterrupt:  # a second signal while the first was being reported
            status, code, error = "failed", 130, "interrupted"
        with signals.ignored():
            return self.finish(status, code, error)

    def play_and_judge(self) -> tuple[str, int, str]:
        """(status, exit code, error) of playing the demo; never raises but for a signal."""
        status, code, error = "failed", 1, ""
        try:
            job = self.play()
            if job.exit_code == 0 and not job.epochs:
                raise DemoError(f"job {job.job_id} exited 0 but trained no epoch (nothing "
                                f"left to resume?): see {self.logs}")
            if job.exit_code != 0:
                cause = joblog.failure_cause(job.output_tail, job.first_exception)
                raise DemoError(f"the training job {job.job_id} failed (dl-run exit status "
                                f"{job.exit_code}): "
                                f"{cause or chr(10).join(job.output_tail[-10:])}")
            if self.ns.data:
                demo_data.check(self, job.managed_id or job.job_id)
            ran = self.slurm.get("job")
            how = (f" (Slurm, as {ran['user']} on {ran['num_nodes']} nodes: {ran['nodes']})"
                   if ran else "")
            self.ok(f"job {job.job_id} succeeded: accuracy {job.final_acc}, world size "
                    f"{job.world_size}{how}")
            status, code = "succeeded", 0
        except (DemoError, dp.DeployError, NodeError) as exc:
            error = str(exc)
            self.console.print(f"[bold red]error:[/] {exc}", highlight=False)
        except Exception as exc:  # a bug (ours or a component's): still clean up
            import traceback

            error = f"{type(exc).__name__}: {exc}"
            (self.logs / "demo-traceback.log").parent.mkdir(parents=True, exist_ok=True)
            (self.logs / "demo-traceback.log").write_text(traceback.format_exc())
            self.console.print(f"[bold red]error:[/] {error}", highlight=False)
            self.console.print(traceback.format_exc(), highlight=False, markup=False)
        except KeyboardInterrupt:
            error = "interrupted"
            code = 130
            self.console.print("[bold red]interrupted[/]: stopping everything")
        return status, code, error

    def finish(self, status: str, code: int, error: str) -> int:
        """Tear down (unless kept), write the report, say how it went; the exit code."""
        ns = self.ns
        if self.cluster is not None:  # the groups as Auto Scaling left them, for the report
            with contextlib.suppress(Exception):
                dp.refresh_instances(self.session(), self.cluster.groups.values())
        report_path = Path(ns.report).resolve()
        rep = report.build_report(self, status, code, error)
        # --keep keeps a failed cluster too (to inspect it), unless Ctrl-C asked to stop.
        keep = ns.keep and code != 130 and self.master() is not None
        rep["kept"] = self.kept = keep
        # A failed run keeps its work dir: its logs are the explanation. --stop removes it.
        remove_work = self.created_work and not keep and status == "succeeded"
        try:
            if not keep:
                self.step("tearing down: every process we started, by process group")
                survivors, seen = self.teardown()
                rep["leftover_pids"] = survivors
                rep["stopped_pids"] = seen
                rep["timings"]["total_s"] = round(time.monotonic() - self.t0, 2)
                if survivors:
                    self.console.print(f"[bold red]processes still alive: {survivors}[/]")
                    code = code or 1
                else:
                    self.ok(f"{len(self.groups())} process group(s) stopped, none left")
            else:
                self.save_state()
            rep["nodes"] = report.node_report(self)  # statuses after teardown
            rep["work_dir_removed"] = remove_work
        finally:
            report_path.parent.mkdir(parents=True, exist_ok=True)
            report_path.write_text(json.dumps(rep, indent=2) + "\n")
            if remove_work:
                shutil.rmtree(self.work, ignore_errors=True)
        if status == "succeeded":
            report.summary_table(self.console, rep)
        self.console.print(f"report: {report_path}")
        if keep:
            report.keep_instructions(self)
        if status != "succeeded":
            report.failure_epilogue(self, error, kept=keep)
        return code


def stop_from_state(path: str, console, *, keep_files: bool = False) -> int:
    """``--stop``: stop what a ``--keep`` (or failed) run left, using the PIDs it recorded;
    then remove the temp work dir it made, after listing what that deletes, unless
    ``keep_files``."""
    state_path = Path(path)
    try:
        state = json.loads(state_path.read_text())
    except (OSError, ValueError) as exc:
        console.print(f"[bold red]error:[/] cannot read state file {path}: {exc}")
        return 2
    # the background service first (emulator.demo.keeper): it must not replace or boot
    # nodes while they stop; then the state it kept current, with every node it booted
    service = [Tracked.from_dict(state["service"])] if state.get("service") else []
    service = [g for g in service if g.same_process() and pids_in_groups([g.pid])]
    if keeper.stop_service(state):
        console.print("[bold red]error:[/] the emulator service did not stop")
        return 1
    with contextlib.suppress(OSError, ValueError):
        state = json.loads(state_path.read_text())
    groups = [Tracked.from_dict(n["group"]) for n in state.get("nodes", []) if n.get("group")]
    groups += [Tracked.from_dict(r) for r in state.get("runners", [])]
    efs = Path(state["work_dir"]) / "efs"
    for pgid in joblog.share_groups(efs):
        if pids_in_groups([pgid]):
            groups.append(Tracked("job share", pgid, None))
    if state.get("cloud"):
        groups.append(Tracked.from_dict(state["cloud"]))
    work = Path(state["work_dir"])
    remove = bool(state.get("remove_work_dir")) and not keep_files and work.exists()
    if remove:  # say what goes before it goes
        console.print(f"--stop deletes the work directory {work} with everything in it:\n"
                      + report.work_contents(work)
                      + "\n  (to keep it: --stop STATE_FILE --keep-files)", highlight=False)
    # what is actually running (a recorded group may have ended long ago)
    running = service + [g for g in groups if g.same_process() and pids_in_groups([g.pid])]
    left = set()
    for node in state.get("nodes", []):  # Slurm's daemons, and the steps that left their group
        if node.get("address"):
            left |= slurm_node.stop(node["address"], grace=10)
    left |= stop_groups(groups, grace=15)
    slurm.cleanup_from_state(state)
    for node in state.get("nodes", []):  # the machines are gone, and their kernels' rules
        if node.get("imds_url"):
            with contextlib.suppress(imds_guard.GuardError):
                imds_guard.remove(node["imds_url"])
    if left:
        console.print(f"[bold red]still alive:[/] {sorted(left)}")
        return 1
    console.print(f"stopped {len(running)} process group(s)" if running else
                  f"nothing was running (the {len(groups)} recorded process group(s) had "
                  f"ended)")
    if remove:
        shutil.rmtree(work, ignore_errors=True)
        console.print(f"removed {work}")
    elif work.exists():
        console.print(f"kept {work}")
    return 0
