"""``dl-run``: start a training job on every node, stream its output, return one exit status.

    dl-run [options] -- <command ...>
    dl-run -- -m bootstrap_scripts.examples.train_digits --epochs 20

The runner reads the membership the node agent wrote (``<root>/opt/deeplearning/``), turns
the command into per-node shares with the chosen launcher (``launchers``), publishes them as
a job spec on EFS, and every node's job executor starts its share at once (``executor``).
It then tails every node's log with a ``[node-rank address]`` prefix, and exits 0 only if
every share exited 0. Ctrl-C / SIGTERM writes a cancel marker; the executors stop their
process groups within seconds. See docs/runner.md.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import shlex
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bootstrap_scripts import job_spec as js
from bootstrap_scripts import launchers as ln
from bootstrap_scripts.membership import MEMBERSHIP_FILE, Membership, MembershipError

#: Variables of the runner's environment that every share inherits (the nodes are
#: identical machines, so the user's PATH / venv / conda env mean the same there).
FORWARDED_ENV = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV", "CONDA_PREFIX",
                 "CONDA_DEFAULT_ENV", "HOME", "USER", "LOGNAME")

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_SIGINT = 130
EXIT_SIGTERM = 143


class RunError(Exception):
    """A problem that stops the job before or while it runs; ``code`` is the exit status."""

    def __init__(self, message: str, code: int = EXIT_FAILED):
        super().__init__(message)
        self.code = code


def say(msg: str) -> None:
    print(f"[dl-run] {msg}", file=sys.stderr, flush=True)


# -- arguments -----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dl-run", usage="dl-run [options] -- <command ...>",
        description="Start a training job on every node of the cluster and watch it.")
    p.add_argument("--launcher", default="torchrun", choices=ln.LAUNCHERS,
                   help="how ranks are started (default: torchrun)")
    p.add_argument("--dry-run", action="store_true", help="print per-node commands, run nothing")
    p.add_argument("--name", default="", help="job name, prefix of the job id (default: launcher)")
    p.add_argument("--job-id", default="", help="explicit job id (default: generated)")
    p.add_argument("--root", default=os.environ.get("DL_ROOT", "/"),
                   help="node root prefix where the agent wrote its files (default: /)")
    p.add_argument("--membership", default="", help="membership.json to use "
                   "(default: <root>/opt/deeplearning/membership.json)")
    p.add_argument("--mount-point", default="", help="EFS mount point (default: the membership's)")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="extra environment for every rank (repeatable)")
    p.add_argument("--forward", action="append", default=[], metavar="VAR",
                   help="forward this variable of the runner's environment (repeatable)")
    p.add_argument("--cwd", default="", help="working directory of every rank (default: current)")
    p.add_argument("--python", default="", help="interpreter for torchrun/tf/mxnet "
                   "(default: this one if it has torch, else python3)")
    g = p.add_argument_group("torchrun")
    g.add_argument("--nnodes", default="", help="N or MIN:MAX (default: the node count)")
    g.add_argument("--nproc-per-node", type=int, default=0,
                   help="processes per node (default: its GPU count, 1 on CPU nodes)")
    g.add_argument("--max-restarts", type=int, default=0, help="torchrun restarts (default: 0)")
    g.add_argument("--rdzv-port", type=int, default=29400, help="rendezvous port (default: 29400)")
    g.add_argument("--elastic", action="store_true",
                   help="elastic job: nodes that join the cluster while it runs join the job, "
                   "draining nodes leave it, the others re-rendezvous and continue "
                   "(implies --nnodes 1:64 and --max-restarts 100 unless given; see "
                   "docs/elastic-training.md)")
    g.add_argument("--rdzv-last-call", type=float, default=0.0,
                   help="seconds a rendezvous waits for more nodes once MIN are there "
                   "(default: torchrun's 30, elastic jobs 5)")
    g = p.add_argument_group("mpi / horovod")
    g.add_argument("--mpi-if-include", default="", help="only these interfaces for MPI traffic "
                   "(replaces --mpi-if-exclude; the loopback emulator uses 'lo')")
    g.add_argument("--mpi-if-exclude", default=ln.DEFAULT_MPI_IF_EXCLUDE,
                   help=f"interfaces MPI must not use (default: {ln.DEFAULT_MPI_IF_EXCLUDE})")
    g.add_argument("--nccl-socket-ifname", default=ln.DEFAULT_NCCL_SOCKET_IFNAME,
                   help=f"NCCL_SOCKET_IFNAME (default: {ln.DEFAULT_NCCL_SOCKET_IFNAME})")
    g.add_argument("--mpi-rsh-agent", default="", help="ssh command for mpirun, e.g. 'ssh -F cfg'")
    g.add_argument("--mpi-arg", action="append", default=[], help="extra mpirun argument")
    g.add_argument("--mpirun", default="mpirun")
    g.add_argument("--horovodrun", default="horovodrun")
    g = p.add_argument_group("tensorflow / mxnet")
    g.add_argument("--tf-mode", default="worker", choices=("worker", "ps"))
    g.add_argument("--tf-port", type=int, default=2222)
    g.add_argument("--mxnet-launch", default="launch.py", help="path of MXNet's tools/launch.py")
    g = p.add_argument_group("supervision")
    g.add_argument("--grace", type=float, default=5.0,
                   help="seconds between SIGTERM and SIGKILL when stopping (default: 5)")
    g.add_argument("--fail-grace", type=float, default=10.0,
                   help="after one node fails, seconds the others get to exit by themselves "
                   "before they are stopped (default: 10)")
    g.add_argument("--heartbeat-timeout", type=float, default=10.0,
                   help="an executor heartbeat older than this is a lost node (default: 10)")
    g.add_argument("--reach-timeout", type=float, default=3.0,
                   help="how long to wait for a missing executor before failing (default: 3)")
    g.add_argument("--start-timeout", type=float, default=30.0,
                   help="seconds for every node to acknowledge its share (default: 30)")
    g.add_argument("--orphan-timeout", type=float, default=30.0,
                   help="executors stop a share whose runner is silent this long (default: 30)")
    g.add_argument("--no-prefix", action="store_true", help="print rank output without prefix")
    return p


def split_command(argv: list[str]) -> tuple[list[str], list[str]]:
    """Options before ``--``, the command after it. Without ``--`` the first token that is
    not an option (or an option's value) starts the command, as with torchrun itself."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    parser = build_parser()
    takes_value = {a for act in parser._actions if act.nargs is None and act.option_strings
                   and not isinstance(act, argparse._StoreTrueAction) for a in act.option_strings}
    i = 0
    while i < len(argv):
        tok = argv[i]
        if not tok.startswith("-"):
            return argv[:i], argv[i:]
        i += 2 if tok in takes_value else 1
    return argv, []


# -- context -------------------------------------------------------------------------------


@dataclass
class Context:
    membership: Membership
    efs: Path


def load_context(args: argparse.Namespace) -> Context:
    path = Path(args.membership) if args.membership else Path(args.root) / MEMBERSHIP_FILE
    try:
        m = Membership.load(path)
    except FileNotFoundError:
        raise RunError(f"no membership at {path}: is the node agent running, and is --root "
                       f"({args.root}) right?", EXIT_USAGE) from None
    except (OSError, MembershipError) as exc:
        raise RunError(f"cannot read membership {path}: {exc}", EXIT_USAGE) from None
    efs = Path(args.mount_point or m.efs_mount)
    return Context(m, efs)


def default_python() -> str:
    return sys.executable if importlib.util.find_spec("torch") else "python3"


def job_env(args: argparse.Namespace) -> dict[str, str]:
    env = {k: os.environ[k] for k in (*FORWARDED_ENV, *args.forward) if k in os.environ}
    env["PYTHONUNBUFFERED"] = "1"  # lines reach the log (and the runner) as they are printed
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise RunError(f"--env expects KEY=VALUE, got {item!r}", EXIT_USAGE)
        env[key] = value
    return env


def launch_options(args: argparse.Namespace, job_id: str, jdir: Path) -> ln.LaunchOptions:
    return ln.LaunchOptions(
        job_id=job_id, job_dir=str(jdir), python=args.python or default_python(),
        nnodes=args.nnodes, nproc_per_node=args.nproc_per_node, max_restarts=args.max_restarts,
        rdzv_port=args.rdzv_port, elastic=args.elastic, rdzv_last_call=args.rdzv_last_call,
        mpirun=args.mpirun, horovodrun=args.horovodrun,
        mpi_if_include=args.mpi_if_include, mpi_if_exclude=args.mpi_if_exclude,
        nccl_socket_ifname=args.nccl_socket_ifname, mpi_rsh_agent=args.mpi_rsh_agent,
        mpi_extra=tuple(args.mpi_arg), forward_env=tuple(args.forward) + tuple(
            e.partition("=")[0] for e in args.env),
        allow_run_as_root=os.geteuid() == 0, tf_mode=args.tf_mode, tf_port=args.tf_port,
        mxnet_launch=args.mxnet_launch,
    )


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


# -- preflight: are the executors there? --------------------------------------------------


def check_reachable(efs: Path, addresses: list[str], *, timeout: float,
                    reach_timeout: float) -> None:
    """Fail fast, naming every address whose executor is missing, stopped or stale. A
    heartbeat whose timestamp is old (or absent) gets ``reach_timeout`` s to move."""
    def state(addr: str) -> tuple[str, int | None]:
        hb = js.read_json(js.executor_heartbeat_path(efs, addr))
        if hb is None:
            return "no executor heartbeat", None
        if hb.get("state") == "stopped":
            return "executor stopped", hb.get("seq")
        age = time.time() - float(hb.get("heartbeat", 0))
        if age > timeout:
            return f"executor heartbeat {age:.0f} s old", hb.get("seq")
        return "", hb.get("seq")

    problems = {a: state(a) for a in addresses}
    problems = {a: s for a, s in problems.items() if s[0]}
    deadline = time.monotonic() + reach_timeout
    while problems and time.monotonic() < deadline:
        time.sleep(0.2)
        for addr in list(problems):
            hb = js.read_json(js.executor_heartbeat_path(efs, addr))
            if hb and hb.get("state") != "stopped" and hb.get("seq") != problems[addr][1]:
                del problems[addr]  # it moved: alive, whatever the clocks say
    if problems:
        detail = "; ".join(f"{a}: {s[0]}" for a, s in sorted(problems.items()))
        raise RunError(f"cannot reach node(s) {', '.join(sorted(problems))} ({detail}); "
                       f"is the job executor running there? (heartbeats under "
                       f"{efs / js.EXECUTORS_DIR})", EXIT_UNREACHABLE)


# -- watching a running job ----------------------------------------------------------------


class LogTailer:
    """Follows every ``nodes/*.log`` of a job and prints new complete lines with a prefix."""

    def __init__(self, nodes: Path, spec: js.JobSpec, *, prefix: bool = True):
        self.nodes = nodes
        self.addresses = {s.rank: s.address for s in spec.shares}
        self.offsets: dict[str, int] = {}
        self.partial: dict[str, bytes] = {}
        self.prefix = prefix

    def _prefix(self, name: str) -> str:
        stem = name[:-4]
        rank_s, _, label = stem.partition("-")
        try:
            rank = int(rank_s)
        except ValueError:
            return f"[{stem}] "
        addr = self.addresses.get(rank, "?")
        return f"[{rank} {addr}{' ' + label if label else ''}] "

    def poll(self, *, final: bool = False) -> None:
        try:
            names = sorted(e.name for e in os.scandir(self.nodes) if e.name.endswith(".log"))
        except FileNotFoundError:
            return
        out = []
        for name in names:
            try:
                with open(self.nodes / name, "rb") as fh:
                    fh.seek(self.offsets.get(name, 0))
                    data = fh.read()
            except OSError:
                continue
            if not data and not (final and self.partial.get(name)):
                continue
            self.offsets[name] = self.offsets.get(name, 0) + len(data)
            buf = self.partial.get(name, b"") + data
            *lines, rest = buf.split(b"\n")
            if final and rest:
                lines.append(rest)
                rest = b""
            self.partial[name] = rest
            pre = self._prefix(name) if self.prefix else ""
            out += [pre + line.decode(errors="replace").rstrip("\r") for line in lines]
        if out:
            sys.stdout.write("\n".join(out) + "\n")
            sys.stdout.flush()


@dataclass
class Watch:
    spec: js.JobSpec
    jdir: Path
    efs: Path
    args: argparse.Namespace
    exits: dict[int, dict] = field(default_factory=dict)
    signal_received: int = 0
    signals: int = 0
    tailer: LogTailer | None = None
    cancelled_at: float | None = None
    first_failure_at: float | None = None
    lost: dict[int, str] = field(default_factory=dict)
    lost_at: dict[int, float] = field(default_factory=dict)
    #: every share of the job: the spec's, plus (elastic) those of nodes that joined
    shares: list[js.Share] = field(default_factory=list)
    left: dict[int, str] = field(default_factory=dict)  # elastic: drained / lost, tolerated

    def __post_init__(self) -> None:
        self.shares = list(self.spec.shares)

    def active(self) -> int:
        return sum(1 for s in self.shares if s.rank not in self.exits and s.rank not in
                   self.left and s.rank not in self.lost)

    def cancel(self, why: str) -> None:
        if self.cancelled_at is None:
            self.cancelled_at = time.monotonic()
            say(f"stopping the job on every node ({why})")
            with contextlib.suppress(OSError):
                js.write_text_atomic(self.jdir / "cancel", why + "\n")


def install_signal_handlers(w: Watch) -> dict:
    """From before the spec is published: a signal can never leave shares unstopped."""
    def on_signal(signum: int, _frame: object) -> None:
        w.signals += 1
        w.signal_received = w.signal_received or signum
        if w.signals > 1:
            raise KeyboardInterrupt  # second Ctrl-C: stop waiting (cancel is already out)

    return {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}


def watch(w: Watch, old_handlers: dict) -> Watch:
    spec, jdir, args = w.spec, w.jdir, w.args
    tailer = LogTailer(js.nodes_dir(jdir), spec, prefix=not args.no_prefix)
    w.tailer = tailer
    old = old_handlers
    started_at = time.monotonic()
    beat_seq, next_beat = 0, 0.0
    hb_seen: dict[str, tuple[object, float]] = {}
    acked: set[int] = set()
    try:
        while True:
            now = time.monotonic()
            if now >= next_beat:
                beat_seq += 1
                js.write_json_atomic(jdir / "runner.json",
                                     {"seq": beat_seq, "pid": os.getpid(), "time": time.time()})
                next_beat = now + 1.0
                check_nodes(w, hb_seen, acked, started_at)
            if w.signal_received and w.cancelled_at is None:
                w.cancel(f"runner got {signal.Signals(w.signal_received).name}")
            tailer.poll()
            for share in list(w.shares):
                if share.rank not in w.exits:
                    rec = js.read_json(js.exit_path(jdir, share.rank))
                    if rec is not None:
                        w.exits[share.rank] = rec
                        if spec.elastic and rec.get("drained"):
                            w.left[share.rank] = "drained"
                            say(f"node {share.rank} ({share.address}) left the job (drained):"
                                f" {w.active()} node(s) now")
                        elif rec.get("returncode") != 0 and w.first_failure_at is None \
                                and share.rank not in w.left:
                            w.first_failure_at = now
                            say(f"node {share.rank} ({share.address}) exited with code "
                                f"{rec.get('returncode')}")
            if all(s.rank in w.exits or s.rank in w.lost or s.rank in w.left
                   for s in w.shares) and w.shares:
                break
            if w.lost and w.cancelled_at is None:
                w.cancel("lost node(s): " + ", ".join(w.lost.values()))
            if w.first_failure_at is not None and w.cancelled_at is None and \
                    now - w.first_failure_at > args.fail_grace:
                w.cancel(f"a node failed {args.fail_grace:.0f} s ago")
            if w.cancelled_at is not None and \
                    now - w.cancelled_at > args.grace + args.heartbeat_timeout + 5:
                say("some nodes did not confirm the stop; giving up waiting")
                break
            time.sleep(0.1)
    except KeyboardInterrupt:
        w.cancel("interrupted")
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        tailer.poll(final=True)
    return w


def check_nodes(w: Watch, hb_seen: dict, acked: set[int], started_at: float) -> None:
    """Once a second: executors still alive (heartbeat moving), shares acknowledged; in an
    elastic job, also nodes that joined (a ``.started`` for a rank the spec does not have)
    and nodes lost while the others carry on (torchrun re-rendezvous without them)."""
    now = time.monotonic()
    if w.spec.elastic:
        discover_joined(w)
    for share in w.shares:
        if share.rank in w.exits or share.rank in w.lost or share.rank in w.left:
            continue
        if share.rank not in acked:
            if js.started_path(w.jdir, share.rank).exists():
                acked.add(share.rank)
            elif now - started_at > w.args.start_timeout:
                w.lost[share.rank] = (f"node {share.rank} ({share.address}) did not start its "
                                      f"share within {w.args.start_timeout:.0f} s")
                continue
        hb = js.read_json(js.executor_heartbeat_path(w.efs, share.address)) or {}
        seq = hb.get("seq")
        prev = hb_seen.get(share.address)
        if prev is None or prev[0] != seq:
            hb_seen[share.address] = (seq, now)
        elif (now - prev[1] > w.args.heartbeat_timeout or hb.get("state") == "stopped") and \
                js.read_json(js.exit_path(w.jdir, share.rank)) is None:
            why = (f"node {share.rank} ({share.address}): executor heartbeat stopped "
                   f"{now - prev[1]:.0f} s ago")
            if w.spec.elastic and share.rank != 0 and w.active() > 1:
                w.left[share.rank] = why
                w.lost_at[share.rank] = time.time()
                say(f"{why}: lost; the elastic job continues on {w.active()} node(s)")
            else:
                w.lost[share.rank] = why
                w.lost_at[share.rank] = time.time()


def discover_joined(w: Watch) -> None:
    """Shares that executors of joining nodes started (elastic jobs, protocol §7)."""
    known = {s.rank for s in w.shares}
    try:
        names = [e.name for e in os.scandir(js.nodes_dir(w.jdir)) if e.name.endswith(".started")]
    except FileNotFoundError:
        return
    for name in sorted(names):
        try:
            rank = int(name.split(".")[0])
        except ValueError:
            continue
        if rank in known:
            continue
        rec = js.read_json(js.nodes_dir(w.jdir) / name)
        if not rec or not rec.get("address"):
            continue
        share = js.Share(rank, str(rec["address"]), ())
        w.shares.append(share)
        if w.tailer is not None:
            w.tailer.addresses[rank] = share.address
        say(f"node {rank} ({share.address}) joined the job: {w.active()} node(s) now")


def summarize(w: Watch) -> int:
    results = []
    failed = []
    for share in w.shares:
        rec = w.exits.get(share.rank)
        rc = rec.get("returncode") if rec else None
        reason = rec.get("reason", "") if rec else (w.lost.get(share.rank) or
                                                     w.left.get(share.rank, "no exit recorded"))
        left = share.rank in w.left
        results.append({"rank": share.rank, "address": share.address, "returncode": rc,
                        "reason": reason if rc != 0 else "", "left": left,
                        "joined": share.rank not in {s.rank for s in w.spec.shares}})
        if rc != 0 and not left:
            lost = share.rank in w.lost
            finished = w.lost_at.get(share.rank) if lost else (rec or {}).get("finished_at")
            failed.append((share, rc, reason, bool(rec and rec.get("cancelled")), lost,
                           float(finished or 0.0)))
    ok_exits = [r for r in results if r["returncode"] == 0]
    if w.spec.elastic and not failed and not ok_exits and not w.signal_received:
        failed = [(s, None, "every node left the job", False, True, 0.0) for s in w.shares[:1]]
    status = "succeeded" if not failed and not w.signal_received else "failed"
    if w.signal_received:
        status = "cancelled"
    js.write_json_atomic(w.jdir / "result.json", {"job_id": w.spec.job_id, "status": status,
                                                  "launcher": w.spec.launcher,
                                                  "elastic": w.spec.elastic, "nodes": results})
    with contextlib.suppress(OSError):
        js.write_text_atomic(w.jdir / "done", status + "\n")
    if w.signal_received:
        say(f"job {w.spec.job_id} cancelled ({signal.Signals(w.signal_received).name})")
        return EXIT_SIGINT if w.signal_received == signal.SIGINT else EXIT_SIGTERM
    if not failed:
        extra = ""
        if w.spec.elastic:
            joined = sum(r["joined"] for r in results)
            extra = f" ({joined} joined, {len(w.left)} left while it ran)"
        say(f"job {w.spec.job_id} succeeded on {len(ok_exits)} node(s){extra}")
        return 0
    # The cause comes first: a LOST node (its survivors' errors are consequences), then
    # nodes that failed by themselves in the order they failed, then those stopped for it.
    failed.sort(key=lambda f: (not f[4], f[3], f[5], f[0].rank))
    parts = []
    for share, rc, reason, cancelled, lost, _when in failed:
        node = f"node rank {share.rank} ({share.address})"
        if rc is None:
            parts.append(f"{node}: {reason.removeprefix(f'node {share.rank} ({share.address}): ')}"
                         + (" (lost)" if lost else ""))
        elif cancelled:
            parts.append(f"{node} was stopped ({reason}, code {rc})")
        else:
            parts.append(f"{node} exited with code {rc}" + (f" ({reason})" if reason else ""))
    say(f"job {w.spec.job_id} FAILED: " + "; ".join(parts))
    say(f"logs: {js.nodes_dir(w.jdir)}")
    return EXIT_FAILED


# -- main ----------------------------------------------------------------------------------


def run(argv: list[str]) -> int:
    opts_argv, command = split_command(argv)
    args = build_parser().parse_args(opts_argv)
    ctx = load_context(args)
    m = ctx.membership
    job_id = js.validate_job_id(args.job_id) if args.job_id else js.new_job_id(
        args.name or args.launcher)
    jdir = js.job_dir(ctx.efs, job_id)
    env = job_env(args)
    if args.elastic and args.launcher != "torchrun":
        raise RunError(f"--elastic needs the torchrun launcher (its elastic rendezvous), "
                       f"not {args.launcher!r}", EXIT_USAGE)
    try:
        plan = ln.plan(args.launcher, m, command, launch_options(args, job_id, jdir))
    except ln.LaunchError as exc:
        raise RunError(str(exc), EXIT_USAGE) from None
    commands = render_commands(plan, m, env)
    say(f"job {job_id}")
    say(f"launcher: {plan.summary}")
    say("nodes: " + ", ".join(f"{n.rank}={n.address}{' (master)' if n.role == 'master' else ''}"
                              for n in m.nodes) + f" (membership generation {m.generation})")
    if args.dry_run:
        sys.stdout.write(commands)
        return 0
    check_reachable(ctx.efs, [s.address for s in plan.shares],
                    timeout=args.heartbeat_timeout, reach_timeout=args.reach_timeout)
    if jdir.exists():
        raise RunError(f"job directory {jdir} already exists: choose another --job-id", EXIT_USAGE)
    say(f"logs: {js.nodes_dir(jdir)}/")
    js.nodes_dir(jdir).mkdir(parents=True)
    for name, content in plan.files.items():
        js.write_text_atomic(jdir / name, content)
    js.write_text_atomic(jdir / "commands.txt", commands)
    js.write_json_atomic(jdir / "runner.json", {"seq": 0, "pid": os.getpid(), "time": time.time()})
    spec = js.JobSpec(
        job_id=job_id, launcher=plan.launcher, shares=plan.shares, env=env,
        cwd=os.path.abspath(args.cwd or os.getcwd()), created_at=time.time(),
        grace_seconds=args.grace, orphan_timeout=args.orphan_timeout,
        master_only=plan.master_only, elastic=args.elastic, generation=m.generation,
        join_template=plan.join_template,
    )
    w = Watch(spec, jdir, ctx.efs, args)
    old = install_signal_handlers(w)
    js.write_text_atomic(jdir / "spec.json", spec.to_json())  # the go signal: written last
    return summarize(watch(w, old))


def main(argv: list[str] | None = None) -> int:
    try:
        return run(list(sys.argv[1:] if argv is None else argv))
    except RunError as exc:
        say(f"error: {exc}")
        return exc.code
    except js.JobSpecError as exc:
        say(f"error: {exc}")
        return EXIT_USAGE
    except KeyboardInterrupt:  # before the job was published: nothing to stop
        say("interrupted before the job started")
        return EXIT_SIGINT


if __name__ == "__main__":
    sys.exit(main())
