"""The health gate: every check on every node, each within its time budget (``dl-health --deep``).

    report = run_gate(root, mount_point, membership, addresses=None, settings=None)
    report.ok, report.failures  # [NodeFailure(address, instance_id, check, value, detail)]

The job controller calls it before each attempt and before a replacement node joins; a node
with a failure is left out and marked unhealthy there. How it runs (no ssh anywhere):

1. executors: a node whose job executor is missing, stopped or silent (its heartbeat on EFS)
   is not sent anything; it fails ``executor`` at once.
2. what each node should have, asked once on the master: the GPUs of its instance type
   (DescribeInstanceTypes, cached on EFS) and its EFA interfaces (``ops.instance_types``).
3. the node-local checks, one ``each`` job ``health-checks-…`` through the job executors
   (``dl-run --unmanaged``, in a child process): ``ops.node_checks`` prints each finding as it
   has it; the gate reads them from the shares' logs on EFS. A node that has not started
   its share within ``budget_start`` fails ``executor`` with "timeout after N s"; a started
   node that has no answer for a check when that check's budget ran out fails that check.
4. a timed all-reduce, one torchrun job ``health-allreduce-…`` across the nodes that passed
   everything so far (``ops.allreduce``): each node's bus bandwidth against the floor. It
   runs as the gate's own system user, not root (``jobs.engine.gate_identity``: why, and
   when it cannot).
5. the verdicts (``ops.gate_report``): one cell per node and check, the failures.
Both jobs are stopped (cancel marker, then the runner) when the gate stops waiting.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import bootstrap_scripts
from bootstrap_scripts.jobs.engine import gate_identity, userfiles
from bootstrap_scripts.jobs.engine.reachability import MOVE_WITHIN_SECONDS, Executors
from bootstrap_scripts.jobs.engine.run import nodes_membership
from bootstrap_scripts.ops import gate_report as gr
from bootstrap_scripts.ops import instance_types as it
from bootstrap_scripts.ops.node_checks import MARKER
from bootstrap_scripts.protocol import record_base, store
from bootstrap_scripts.protocol.errors import ProtocolError
from bootstrap_scripts.protocol.jobs import DEFAULT_RDZV_PORT, new_job_id
from bootstrap_scripts.protocol.membership import Membership, Node
from bootstrap_scripts.protocol.paths import ClusterPaths, JobPaths
from bootstrap_scripts.protocol.records import InstanceTypeFacts, ShareExit
from bootstrap_scripts.protocol.run_request import FORWARDED_ENV, RunRequest

GateReport, GateSettings, NodeFailure = gr.GateReport, gr.GateSettings, gr.NodeFailure
POLL_SECONDS = 0.2
#: Seconds a runner gets to finish by itself once the gate has every answer, then per signal.
RUNNER_GRACE = 5.0
Progress = Callable[[str], None]


@dataclass
class Share:
    """What the gate saw of one node's share of a gate job."""

    node: Node
    rank: int
    found: dict[str, dict] = field(default_factory=dict)
    started_at: float | None = None  # monotonic, when the gate saw ``.started``
    exit: ShareExit | None = None
    error_line: str = ""


def parse_log(text: str) -> tuple[dict[str, dict], str]:
    """The ``DL-HEALTH`` findings of a share's log, by check, and its last other line."""
    found: dict[str, dict] = {}
    last = ""
    for line in text.splitlines():
        i = line.find(MARKER)
        if i < 0:
            if line.strip():
                last = line.strip()
            continue
        with contextlib.suppress(ValueError, KeyError, TypeError):
            item = record_base.loads(line[i + len(MARKER):])
            found[str(item["check"])] = item
    return found, last[-300:]


def sub_membership(m: Membership, nodes: list[Node], efs: Path) -> Membership:
    """The membership a gate job runs on: ``nodes`` only, in membership order (so the
    master first if among them), ranks renumbered; GPU counts as the agents registered."""
    return nodes_membership(m, nodes, reason="health gate", efs_mount=str(efs))


class GateJob:
    """One gate job through ``dl-run --unmanaged`` in a child process, followed on EFS; run
    as ``user`` (None: as this process, root)."""

    def __init__(self, kind: str, root: Path, efs: Path, m: Membership, nodes: list[Node],
                 s: GateSettings, window: float, user: pwd.struct_passwd | None = None) -> None:
        self.kind, self.root, self.efs, self.settings = kind, root, efs, s
        self.user = user
        self.job_id = new_job_id(f"health-{kind}")
        self.paths: JobPaths = ClusterPaths(efs).job(self.job_id,
                                                     user.pw_name if user else None)
        self.sub = sub_membership(m, nodes, efs)
        self.shares = {n.address: Share(n, self.sub.node_by_address(n.address).rank)
                       for n in nodes}
        self.window = window
        self.proc: subprocess.Popen | None = None
        self.published: float | None = None
        self.tmp = tempfile.TemporaryDirectory(prefix="dl-health-")
        self.output = Path(self.tmp.name) / "runner.log"

    def request(self, launcher: str, command: list[str], rdzv_port: int) -> RunRequest:
        """The gate job's run request. The gate decides who is late: the runner must not
        cancel the job before it (its timeouts are the gate's window). Without PATH the
        ranks get none from here: each node's checks find the node's own tools
        (nvidia-smi, dcgmi, fi_info) on its executor's PATH, not this process's."""
        w = self.window
        package_parent = str(Path(bootstrap_scripts.__file__).resolve().parent.parent)
        env = {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ and k != "PATH"}
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (package_parent, env.get("PYTHONPATH", "")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        return RunRequest(job_id=self.job_id, command=tuple(command), launcher=launcher,
                          env=env, cwd="/", python=self.settings.python, rdzv_port=rdzv_port,
                          heartbeat_timeout=w, start_timeout=w, fail_grace=w,
                          reach_timeout=1.0, grace=3.0, prefix=False)

    def start(self, launcher: str, command: list[str],
              rdzv_port: int = DEFAULT_RDZV_PORT) -> None:
        """Run the gate job through the engine's front door (``dl-run --unmanaged
        --request -``, its run request on standard input) in a child process."""
        membership = Path(self.tmp.name) / "membership.json"
        membership.write_text(self.sub.to_json())
        request = self.request(launcher, command, rdzv_port)
        argv = [sys.executable, "-m", "bootstrap_scripts.jobs.cli.dl_run", "--unmanaged",
                "--request", "-", "--root", str(self.root), "--membership", str(membership),
                "--mount-point", str(self.efs)]
        env = {**os.environ, "PYTHONPATH": request.env["PYTHONPATH"]}
        ids = gate_identity.hand_over(self.user, self.efs, Path(self.tmp.name), env)
        with open(self.output, "wb") as out:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=out,
                                         stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True, cwd="/", **ids)
        assert self.proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            self.proc.stdin.write(request.to_json().encode())
            self.proc.stdin.close()

    def runner_error(self) -> str:
        text = self.output.read_text(errors="replace") if self.output.exists() else ""
        lines = [ln for ln in text.splitlines() if "error" in ln.lower()] or text.splitlines()
        return (lines[-1] if lines else "no output")[-300:]

    def poll(self) -> None:
        now = time.monotonic()
        if self.published is None and store.exists(self.paths.spec):
            self.published = now
        for share in self.shares.values():
            if share.exit is not None:
                continue
            if share.started_at is None and store.exists(self.paths.started(share.rank)):
                share.started_at = now
            try:
                text = store.read_text(self.paths.log(share.rank), errors="replace") or ""
            except ProtocolError:  # no regular file of text, or too large: nothing found
                text = ""
            share.found, share.error_line = parse_log(text)
            share.exit = store.read_record_or_none(self.paths.exit(share.rank), ShareExit)

    def runner_done(self) -> bool:
        return self.proc is None or self.proc.poll() is not None

    def stop(self, *, finishing: bool = False) -> None:
        """Stop whatever still runs: the cancel marker (executors stop the shares), then the
        runner (a second signal makes it stop waiting for nodes that will not answer).
        ``finishing``: every node answered, the runner gets a moment to end by itself."""
        if self.proc is not None and self.proc.poll() is None and finishing:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(RUNNER_GRACE)
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(OSError):
                if store.exists(self.paths.dir):
                    u = self.user
                    with userfiles.as_user(u.pw_uid if u else -1, u.pw_gid if u else -1):
                        store.atomic_write(self.paths.cancel, "health gate: done waiting\n")
            for sig, wait in ((signal.SIGTERM, 2.0), (signal.SIGINT, RUNNER_GRACE),
                              (signal.SIGKILL, RUNNER_GRACE)):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, sig)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(wait)
                    break
        self.tmp.cleanup()


def follow(job: GateJob, checks: tuple[str, ...], deadline: float) -> bool:
    """Poll until every node answered every check, or gave up, or its budgets ran out.
    True when every node answered every check."""
    s = job.settings
    start_limit = time.monotonic() + s.budget_start + 5  # the runner itself must start too
    while time.monotonic() < deadline:
        job.poll()
        now = time.monotonic()
        base = job.published or now
        if job.published is None and (job.runner_done() or now > start_limit):
            return False
        pending = False
        if all(all(c in sh.found for c in checks) for sh in job.shares.values()):
            return True
        for share in job.shares.values():
            if share.exit is not None or all(c in share.found for c in checks):
                continue
            if share.started_at is None:
                pending |= now < base + s.budget_start
                continue
            pending |= any(c not in share.found and now < share.started_at
                           + s.node_budget(c) + 1 for c in checks)
        if not pending:
            return False
        time.sleep(POLL_SECONDS)
    return False


def expectations(efs: Path, nodes: list[Node], types: dict[str, str],
                 progress: Progress) -> dict[str, gr.Expected]:
    """What EC2 says each node should have (``types``: address -> instance type)."""
    facts = it.instance_type_facts(efs, types.values())
    efa_ids = [n.instance_id for n in nodes if isinstance(facts.get(types[n.address]),
                                                          InstanceTypeFacts)
               and facts[types[n.address]].efa_supported]
    efa: dict[str, int] = {}
    efa_error = ""
    if efa_ids:
        try:
            efa = it.efa_attachments(efa_ids)
        except it.LookupFailed as exc:
            efa_error = str(exc)
            progress(f"EFA attachments unknown: {exc}")
    out = {}
    for n in nodes:
        itype = types[n.address]
        f = facts.get(itype)
        if not itype:
            out[n.address] = gr.Expected(efa=0)
        elif isinstance(f, InstanceTypeFacts):
            attached = (efa.get(n.instance_id) if not efa_error else None) if \
                f.efa_supported else 0
            out[n.address] = gr.Expected(itype, f.gpus, f"{itype} (DescribeInstanceTypes)",
                                         efa_error, attached)
        else:
            out[n.address] = gr.Expected(itype, None, "", str(f), None)
    return out


def run_gate(root: Path, mount_point: Path, membership: Membership, *,
             addresses: list[str] | None = None, settings: GateSettings | None = None,
             progress: Progress | None = None) -> GateReport:
    """Run every check on ``addresses`` (default: every node of ``membership``)."""
    s = settings or GateSettings()
    say = progress or (lambda _msg: None)
    t0 = time.monotonic()
    deadline = t0 + s.budget_total
    efs = Path(mount_point)
    wanted = list(addresses) if addresses is not None else [n.address for n in membership.nodes]
    unknown = [a for a in wanted if membership.node_by_address(a) is None]
    if unknown:
        raise ValueError(f"not members of generation {membership.generation}: "
                         f"{', '.join(unknown)}")
    targets = [n for n in membership.nodes if n.address in wanted]
    rows = {n.address: gr.NodeReport(n, instance_type=n.instance_type) for n in targets}
    report = GateReport(list(rows.values()), settings=s)
    down = Executors(efs, s.executor_stale).wait(
        [n.address for n in targets], timeout=min(s.executor_stale, MOVE_WITHIN_SECONDS))
    for address, why in down.items():
        rows[address].cells["executor"] = gr.Cell(gr.FAIL, why, "not sent the checks")
    live = [n for n in targets if n.address not in down]
    if live:
        say(f"node checks on {len(live)} node(s)")
        run_node_checks(root, efs, membership, live, rows, s, deadline, report, say)
    healthy = [rows[n.address].node for n in live if rows[n.address].ok]
    for n in targets:
        if n not in healthy:
            rows[n.address].cells.setdefault("allreduce", gr.Cell(gr.SKIP, "-", "not run: "
                                                                  "the node failed a check"))
    if s.allreduce and healthy:
        say(f"all-reduce across {len(healthy)} node(s)")
        run_allreduce(root, efs, membership, healthy, rows, s, deadline, report, say)
    elif healthy:
        for n in healthy:
            rows[n.address].cells["allreduce"] = gr.Cell(gr.NA, "n/a", "disabled")
    report.duration_s = time.monotonic() - t0
    return report


def run_node_checks(root: Path, efs: Path, m: Membership, nodes: list[Node],
                    rows: dict[str, gr.NodeReport], s: GateSettings, deadline: float,
                    report: GateReport, say: Progress) -> None:
    need_imds = any(not n.instance_type for n in nodes)
    command = ["python", "-m", "bootstrap_scripts.ops.node_checks", "--json", "--efs", str(efs),
               "--efs-mib", str(s.efs_mib), "--budget-nvidia-smi", f"{s.budget_nvidia_smi:g}",
               "--budget-dcgm", f"{s.budget_dcgm:g}", "--budget-efa", f"{s.budget_efa:g}",
               "--budget-efs", f"{s.budget_efs:g}", "--budget-disk", f"{s.budget_disk:g}",
               *(["--imds", "--budget-imds", f"{s.budget_imds:g}"] if need_imds else [])]
    checks = ("nvidia-smi", "dcgm", "efa", "efs", "disk", *(("imds",) if need_imds else ()))
    window = s.budget_start + max(s.node_budget(c) for c in checks) + 5
    job = GateJob("checks", root, efs, m, nodes, s, window)
    report.jobs["checks"] = job.job_id
    complete = False
    try:
        job.start("each", command)
        complete = follow(job, checks, deadline)
        job.poll()
    finally:
        job.stop(finishing=complete)
    types = {}
    for n in nodes:
        imds = job.shares[n.address].found.get("imds", {})
        types[n.address] = n.instance_type or (imds.get("value", "") if imds.get("status") ==
                                               "ok" else "")
        rows[n.address].instance_type = types[n.address]
    expected = expectations(efs, nodes, types, say)
    for n in nodes:
        fill_node_cells(rows[n.address], job, expected[n.address], s)


def late_cell(job: GateJob, share: Share, check: str) -> gr.Cell:
    """A check with no finding: the node gave up (its share exited) or ran out of time."""
    if share.exit is not None:
        return gr.Cell(gr.FAIL, f"exit {share.exit.returncode}", share.exit.reason
                       or share.error_line or "the check process ended without an answer")
    return gr.timeout(job.settings.node_budget(check))


def fill_node_cells(row: gr.NodeReport, job: GateJob, expected: gr.Expected,
                    s: GateSettings) -> None:
    share = job.shares[row.node.address]
    if job.published is None:
        row.cells["executor"] = gr.Cell(gr.FAIL, "checks not started",
                                        f"the gate's job did not start: {job.runner_error()}")
        return
    if share.started_at is None:
        if share.exit is not None:  # it could not start the share
            row.cells["executor"] = gr.Cell(gr.FAIL, f"exit {share.exit.returncode}",
                                            share.exit.reason)
        else:
            row.cells["executor"] = gr.timeout(s.budget_start, "the node's executor did not "
                                               "start the checks (is it running?)")
        return
    row.cells["executor"] = gr.Cell(gr.OK, "answers", f"checks job {job.job_id}")
    found = share.found
    nvidia = found.get("nvidia-smi")
    if nvidia is None:
        row.cells["nvidia-smi"] = late_cell(job, share, "nvidia-smi")
        row.cells["gpus"] = gr.Cell(gr.SKIP, "-", "not counted: nvidia-smi did not answer")
    else:
        row.cells["nvidia-smi"] = gr.decide_nvidia_smi(nvidia, expected, row.node.gpus)
        row.cells["gpus"] = gr.decide_gpus(nvidia, expected, row.node.gpus)
    for check, decide in (("dcgm", lambda f: gr.decide_dcgm(f, expected, row.node.gpus)),
                          ("efa", lambda f: gr.decide_efa(f, expected)),
                          ("efs", lambda f: gr.decide_efs(f, s.efs_floor_mbps)),
                          ("disk", lambda f: gr.decide_disk(f, s.disk_floor_mib))):
        row.cells[check] = decide(found[check]) if check in found else late_cell(
            job, share, check)
    if gr.gpus_wanted(expected, row.node.gpus) == 0 and "dcgm" not in found:
        row.cells["dcgm"] = gr.Cell(gr.NA, "n/a", "no GPU expected")


def run_allreduce(root: Path, efs: Path, m: Membership, nodes: list[Node],
                  rows: dict[str, gr.NodeReport], s: GateSettings, deadline: float,
                  report: GateReport, say: Progress) -> None:
    command = ["python", "-m", "bootstrap_scripts.ops.allreduce", "--mib",
               f"{s.allreduce_mib:g}", "--iters", str(s.allreduce_iters),
               "--timeout", f"{s.budget_allreduce:g}"]
    window = s.budget_start + s.budget_allreduce + 5
    user, why = gate_identity.collective_user(efs)
    if why:
        say(f"all-reduce as root: {why}")
    job = GateJob("allreduce", root, efs, m, nodes, s, window, user)
    report.jobs["allreduce"] = job.job_id
    complete = False
    try:
        job.start("torchrun", command, s.rdzv_port)
        complete = follow(job, ("allreduce",), deadline)
        job.poll()
    finally:
        job.stop(finishing=complete)
    for n in nodes:
        share = job.shares[n.address]
        found = share.found.get("allreduce")
        if found is not None:
            cell = gr.decide_allreduce(found, s.allreduce_floor_gbps)
        elif job.published is None:
            cell = gr.Cell(gr.FAIL, "not started", job.runner_error())
        elif share.started_at is None and share.exit is None:
            cell = gr.timeout(s.budget_start, "the node's executor did not start the job")
        else:
            cell = late_cell(job, share, "allreduce")
        rows[n.address].cells["allreduce"] = cell
