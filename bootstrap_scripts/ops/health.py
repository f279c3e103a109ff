"""``dl-health``: is every node of the cluster ready to run a job? One table, one exit code.

Replaces the original "ssh to each worker and touch a file on EFS" script. Everything is
read from EFS, so it needs no SSH and works the same on EC2, EMR and the local emulator:

- reachable   the node's job executor heartbeat (an ExecutorHeartbeat record) is seen to
              move (the cluster's one liveness rule, on this command's clock)
- agent       the node agent's registration (a Registration record) is fresh
- generation  the node applied the current membership generation
- gpus        the GPU count the node reports equals the membership's
- efs         EFS is writable from the node (the executor writes and reads back every beat)
              and, from here, a probe file can be written, read and deleted
- disk        the node's local disk has ``--disk-floor-mib`` free, as its executor measures
              it every beat (the gate's ``disk`` check measures it on the node)
- clock       the node's clock agrees with this one
- signed      on the master: the node's registration and heartbeat are its own (signed with
              the key the master learnt from it, ``ops.node_records``), else "not signed by
              that node" or "waiting for its node key"; a record not its own is not used for
              the other columns. On a worker (no key book) the records are unchecked, and
              the output says so

``--deep`` runs the health gate instead (``ops.gate``, docs/health.md): GPUs against the
instance type, nvidia-smi, DCGM, EFA, EFS throughput, local disk space and a timed
all-reduce, each on the nodes themselves and within its time budget.

The agent's registration age and the clock skew are measured against the file server's
clock (file mtimes), not by subtracting two machines' clocks, so a skewed clock is reported
as skew, not as staleness; an executor is judged alive only by its heartbeat moving.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from bootstrap_scripts.jobs.engine.reachability import MOVE_WITHIN_SECONDS, Executors
from bootstrap_scripts.node import node_region
from bootstrap_scripts.ops import deep_health
from bootstrap_scripts.ops import node_records as nrec
from bootstrap_scripts.protocol import launches, state, store
from bootstrap_scripts.protocol.membership import Membership, MembershipError, Node
from bootstrap_scripts.protocol.paths import ClusterPaths, NodePaths
from bootstrap_scripts.protocol.record_base import Record
from bootstrap_scripts.protocol.records import ExecutorHeartbeat

RecordT = TypeVar("RecordT", bound=Record)

CHECKS = ("reachable", "agent", "generation", "gpus", "efs", "disk", "clock", "signed")


@dataclass
class Row:
    node: Node
    cells: dict[str, tuple[bool, str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(ok for ok, _ in self.cells.values())


def probe_efs(efs: Path) -> tuple[bool, str, float, float]:
    """Write, read back and delete a probe file. Returns (ok, detail, local time of the
    write, the server's mtime of it): the pair maps local time onto the server's clock."""
    probe = ClusterPaths(efs).health_probe(f"{socket.gethostname()}-{os.getpid()}")
    token = f"{time.time()}-{os.getpid()}"
    try:
        probe.parent.mkdir(parents=True, exist_ok=True)
        t_local = time.time()
        probe.write_text(token)
        mtime = probe.stat().st_mtime
        back = probe.read_text()
        probe.unlink()
    except OSError as exc:
        with contextlib.suppress(OSError):
            probe.unlink()
        return False, f"probe on {efs} failed: {exc}", time.time(), time.time()
    if back != token:
        return False, f"probe on {efs} read back different content", t_local, mtime
    return True, "writable", t_local, mtime


def stamped(path: Path, read: nrec.NodeRead[RecordT]) -> tuple[RecordT | None, float]:
    """The record read at ``path`` (None if missing, malformed or not believed) and the
    file's mtime (server clock)."""
    st = store.stamp(path)
    return read.record, (st.mtime_ns / 1e9 if st else 0.0)


def signed_cell(reg: nrec.NodeRead, hb: nrec.NodeRead) -> tuple[bool, str]:
    """The ``signed`` column: are the node's registration and heartbeat its own?"""
    verdicts = {reg.verdict, hb.verdict}
    if verdicts == {nrec.UNCHECKED}:
        return True, "unchecked here"
    if nrec.WAITING_FOR_KEY in verdicts:
        return False, nrec.WAITING_FOR_KEY
    bad = [f"{what} {r.verdict}" for what, r in (("registration", reg), ("heartbeat", hb))
           if r.verdict != nrec.CHECKED]
    return (False, "; ".join(bad)) if bad else (True, nrec.CHECKED)


def age_of(mtime: float, local_offset: float, now: float | None = None) -> float:
    """Seconds since the file server stamped ``mtime``, by its clock (this node's clock
    minus ``local_offset``), read now: a heartbeat written while the table was being made
    is 0 s old, never negative (the offset is measured to the millisecond at best)."""
    server_now = (time.time() if now is None else now) - local_offset
    return max(0.0, server_now - mtime)


def disk_cell(hb: ExecutorHeartbeat | None, floor_mib: float) -> tuple[bool, str]:
    """The node's local disk free space, as its executor last measured it, against the
    gate's floor (``--disk-floor-mib``); an executor that does not report it is not failed."""
    if hb is None:
        return False, "unknown"
    if hb.disk_free_mib < 0:
        return True, "not reported"
    return hb.disk_free_mib >= floor_mib, f"{hb.disk_free_mib} MiB free"


def check_node(node: Node, efs: Path, generation: int, local_offset: float,
               args: argparse.Namespace, not_alive: dict[str, str],
               records: nrec.NodeRecords) -> Row:
    row = Row(node)
    paths = ClusterPaths(efs)
    hb_read = records.heartbeat(node.address, node.instance_id)
    reg_read = records.registration(node.instance_id)
    hb, hb_mtime = stamped(paths.executor_heartbeat(node.address), hb_read)
    reg, reg_mtime = stamped(paths.registration(node.instance_id), reg_read)
    if not reg_read.believed:  # the master counts it as not registered: so does this table
        reg = None

    if hb is None:
        row.cells["reachable"] = (False, "no executor heartbeat")
    elif hb.state == "stopped":
        row.cells["reachable"] = (False, "executor stopped")
    else:  # alive by the one rule (seen to move); the age is shown, not judged
        age = age_of(hb_mtime, local_offset)
        row.cells["reachable"] = (node.address not in not_alive,
                                  not_alive.get(node.address, f"{age:.1f}s ago"))

    if reg is None:
        row.cells["agent"] = (False, "not registered")
    else:
        age = age_of(reg_mtime, local_offset)
        row.cells["agent"] = (age <= args.agent_timeout, f"{age:.0f}s ago (pid {reg.agent_pid})")

    # The agent's registration is the authority; the executor's heartbeat is the fallback.
    applied = reg.generation_applied if reg else (hb.generation if hb else None)
    if applied is None:
        row.cells["generation"] = (False, "unknown")
    else:
        row.cells["generation"] = (applied == generation, f"{applied}/{generation}")

    reported = reg.gpus if reg else (hb.gpus if hb else None)
    if reported is None:
        row.cells["gpus"] = (False, f"unknown (expected {node.gpus})")
    else:
        row.cells["gpus"] = (reported == node.gpus, f"{reported} (expected {node.gpus})"
                             if reported != node.gpus else str(reported))

    if hb is None:
        row.cells["efs"] = (False, "unknown")
    elif not hb.efs_ok:
        row.cells["efs"] = (False, "not writable")
    elif args.require_mount and not hb.efs_mounted:
        row.cells["efs"] = (False, f"{hb.efs_mount} not mounted")
    else:
        row.cells["efs"] = (True, "writable")

    row.cells["disk"] = disk_cell(hb, args.gate_disk_floor_mib)

    if hb is None or not hb_mtime:
        row.cells["clock"] = (False, "unknown")
    else:
        # node clock - server clock, minus (our clock - server clock) = node - us
        skew = (hb.heartbeat - hb_mtime) - local_offset
        row.cells["clock"] = (abs(skew) <= args.max_skew, f"{skew:+.2f}s")
    row.cells["signed"] = signed_cell(reg_read, hb_read)
    return row


def waiting_for_keys(records: nrec.NodeRecords, m: Membership) -> list[str]:
    """Registered instances outside the membership whose key the master never learnt (a
    node booted from older user data registers unsigned and sends no key: it never joins)."""
    members = {n.instance_id for n in m.nodes}
    return [iid for iid, r in records.registrations().items()
            if iid not in members and r.verdict == nrec.WAITING_FOR_KEY]


def render_table(rows: list[Row]) -> str:
    header = ["RANK", "ADDRESS", "ROLE", *(c.upper() for c in CHECKS)]
    body = []
    for r in rows:
        cells = []
        for c in CHECKS:
            ok, detail = r.cells[c]
            cells.append(f"{'ok' if ok else 'FAIL'} {detail}".strip())
        body.append([str(r.node.rank), r.node.address, r.node.role, *cells])
    widths = [max(len(x) for x in col) for col in zip(header, *body, strict=True)]
    lines = ["  ".join(x.ljust(w) for x, w in zip(line, widths, strict=True)).rstrip()
             for line in [header, *body]]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="dl-health", description="Check every node of the cluster.")
    p.add_argument("--root", default=os.environ.get("DL_ROOT", "/"),
                   help="node root prefix where the agent wrote its files (default: /)")
    p.add_argument("--membership", default="", help="membership.json (default: the node's)")
    p.add_argument("--mount-point", default="", help="EFS mount point (default: the membership's)")
    p.add_argument("--heartbeat-timeout", type=float, default=10.0,
                   help="an executor heartbeat unchanged this long is gone, s (default: 10)")
    p.add_argument("--agent-timeout", type=float, default=30.0,
                   help="max agent registration age, s (default: 30)")
    p.add_argument("--max-skew", type=float, default=2.0, help="max clock skew, s (default: 2)")
    p.add_argument("--require-mount", action="store_true",
                   help="EFS must be a mount point on every node (real clusters)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    deep_health.add_arguments(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    path = Path(args.membership) if args.membership else NodePaths(args.root).membership
    try:
        m = Membership.load(path)
    except (OSError, MembershipError) as exc:
        print(f"dl-health: cannot read membership {path}: {exc}", file=sys.stderr)
        return 2
    efs = Path(args.mount_point or m.efs_mount)
    if args.deep:
        node_region.adopt(args.root)  # the gate asks EC2; boto3 never asks IMDS for a region
        return deep_health.main(args, m, efs)
    ok_here, detail_here, t_local, t_server = probe_efs(efs)
    mounted_here = os.path.ismount(efs)
    local_offset = t_local - t_server
    try:  # the shared copy may be newer than this node's
        current = state.read_current(efs)
    except (OSError, MembershipError):
        current = None
    generation = max(m.generation, current.generation) if current else m.generation
    records = nrec.NodeRecords(args.root, efs)
    at = {n.address: n.instance_id for n in m.nodes}
    # Executors beat every second: a few seconds of looking tells a live one from a dead one
    # (on the master only a heartbeat its node signed moves).
    not_alive = Executors(efs, args.heartbeat_timeout,
                          read=lambda _efs, a: records.heartbeat(a, at[a]).record).wait(
        [n.address for n in m.nodes], timeout=min(args.heartbeat_timeout, MOVE_WITHIN_SECONDS))
    rows = [check_node(n, efs, generation, local_offset, args, not_alive, records)
            for n in m.nodes]
    no_key = waiting_for_keys(records, m) if records.checked else []
    here_ok = ok_here and (mounted_here or not args.require_mount)
    healthy = here_ok and all(r.ok for r in rows)
    # Failed launches do not make the cluster unhealthy (it formed, maybe in another zone or
    # on another type), but they say why it is smaller or elsewhere than asked.
    try:
        failed_launches = launches.launch_failures(ClusterPaths(efs))
    except (OSError, ValueError) as exc:
        failed_launches = ()
        print(f"dl-health: cannot read the launch failures: {exc}", file=sys.stderr)
    if args.json:
        print(json.dumps({
            "healthy": healthy, "generation": generation, "efs": str(efs),
            "efs_here": {"ok": here_ok, "detail": detail_here, "mounted": mounted_here},
            "records": nrec.CHECKED if records.checked else nrec.UNCHECKED,
            "waiting_for_node_key": no_key,
            "nodes": [{"rank": r.node.rank, "address": r.node.address, "role": r.node.role,
                       "ok": r.ok, **{c: {"ok": ok, "detail": d} for c, (ok, d) in r.cells.items()}}
                      for r in rows],
            "launch_failures": [a.to_dict() for a in failed_launches]}, indent=2))
    else:
        print(f"cluster {m.cluster_id or '?'}: {len(m.nodes)} node(s), generation {generation}, "
              f"EFS {efs} here: {'ok' if here_ok else 'FAIL'} ({detail_here}"
              f"{', mounted' if mounted_here else ', not a mount point'})")
        if not records.checked:
            print(nrec.UNCHECKED_HERE)
        sys.stdout.write(render_table(rows))
        failing = [r for r in rows if not r.ok]
        for r in failing:
            bad = ", ".join(f"{c}: {d}" for c, (ok, d) in r.cells.items() if not ok)
            print(f"node {r.node.rank} ({r.node.address}) FAILED: {bad}")
        if no_key:
            print(f"registered but {nrec.WAITING_FOR_KEY}: {', '.join(no_key)}")
        if failed_launches:
            print(f"failed launches ({len(failed_launches)}, "
                  f"{ClusterPaths(efs).launch_failures}):")
            for a in failed_launches[-10:]:
                print(f"  {a.role} {a.asg}: {launches.describe(a)}")
        print("healthy" if healthy else f"UNHEALTHY: {len(failing)} node(s) failing"
              + ("" if here_ok else ", EFS not usable here"))
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
