"""The health gate's settings, verdicts and report (pure: no I/O, no processes).

``ops.gate`` runs the checks on the nodes and hands their raw findings here; each
``decide_*`` function turns one finding plus what the node should have into a :class:`Cell`,
so every rule of the gate is a small function tested without a cluster. See docs/health.md.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from bootstrap_scripts.protocol.jobs import RDZV_PORTS, listen_port_allowed
from bootstrap_scripts.protocol.membership import Node

#: The table's columns, in order: one per check.
CHECKS = ("executor", "gpus", "nvidia-smi", "dcgm", "efa", "efs", "disk", "allreduce")
OK, FAIL, NA, SKIP = "ok", "fail", "n/a", "skip"


@dataclass(frozen=True)
class GateSettings:
    """Budgets (seconds), floors and sizes of the gate; every one can be set from
    ``dl-health --deep`` (``--budget-dcgm 300``, ``--efs-floor 50`` ...)."""

    budget_nvidia_smi: float = 10.0
    budget_dcgm: float = 120.0
    budget_efa: float = 10.0
    budget_efs: float = 20.0
    budget_disk: float = 5.0
    budget_imds: float = 3.0
    budget_allreduce: float = 120.0
    #: for a node's executor to start the checks (poll + interpreter start)
    budget_start: float = 20.0
    #: the whole gate, whatever the budgets above add up to
    budget_total: float = 400.0
    #: an executor heartbeat not seen to change for this long (the cluster's one liveness
    #: rule, on the gate's clock): the node is not sent the checks at all
    executor_stale: float = 10.0
    efs_mib: int = 8
    efs_floor_mbps: float = 5.0
    #: free MiB the node's local disk must have: below it a job's status files, logs and
    #: checkpoints' local copies fail to be written
    disk_floor_mib: float = 1024.0
    allreduce: bool = True
    allreduce_mib: float = 32.0
    allreduce_iters: int = 5
    allreduce_floor_gbps: float = 0.0
    #: the all-reduce's rendezvous: the window's second port, next to the jobs' default
    rdzv_port: int = RDZV_PORTS[1]
    #: the jobs' interpreter ("" = dl-run's default: this one if it has torch, else python3)
    python: str = ""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name.startswith("budget_") and not value > 0:
                raise ValueError(f"{f.name} must be > 0 s, got {value!r}")
        if self.efs_mib < 1 or self.allreduce_mib <= 0 or self.allreduce_iters < 1:
            raise ValueError(f"efs_mib, allreduce_mib and allreduce_iters must be positive, got "
                             f"{self.efs_mib}, {self.allreduce_mib}, {self.allreduce_iters}")
        if self.efs_floor_mbps < 0 or self.allreduce_floor_gbps < 0 or self.disk_floor_mib < 0:
            raise ValueError(f"floors must be >= 0, got efs {self.efs_floor_mbps} MB/s, "
                             f"all-reduce {self.allreduce_floor_gbps} GB/s, "
                             f"disk {self.disk_floor_mib} MiB")
        if not listen_port_allowed(self.rdzv_port):
            raise ValueError(f"rdzv_port must be in the rendezvous window {RDZV_PORTS[0]}-"
                             f"{RDZV_PORTS[-1]} or 1024-65535, got {self.rdzv_port}")

    def node_budget(self, check: str) -> float:
        """Seconds a started node has for ``check`` (dcgm waits for nvidia-smi first)."""
        return {"nvidia-smi": self.budget_nvidia_smi, "gpus": self.budget_nvidia_smi,
                "dcgm": self.budget_nvidia_smi + 1 + self.budget_dcgm,
                "efa": self.budget_efa, "efs": self.budget_efs, "disk": self.budget_disk,
                "imds": self.budget_imds,
                "allreduce": self.budget_allreduce}[check]


@dataclass(frozen=True)
class Cell:
    """One check on one node: ``status`` ok | fail | n/a | skip, the short ``value`` shown in
    the table and a ``detail`` that says why."""

    status: str
    value: str
    detail: str = ""

    @property
    def failed(self) -> bool:
        return self.status == FAIL

    def text(self) -> str:
        if self.status in (NA, SKIP):
            return self.value or self.status
        return f"{'ok' if self.status == OK else 'FAIL'} {self.value}".strip()


def timeout(seconds: float, detail: str = "") -> Cell:
    return Cell(FAIL, f"timeout after {seconds:g} s", detail or "no answer within the budget")


@dataclass(frozen=True)
class Expected:
    """What a node should have, from EC2 (``ops.instance_types``)."""

    instance_type: str = ""
    gpus: int | None = None  # None: not known
    gpus_source: str = ""  # e.g. "g5.xlarge (DescribeInstanceTypes)"
    error: str = ""  # why it is not known
    efa: int | None = 0  # EFA interfaces attached; None: not known


@dataclass(frozen=True)
class NodeFailure:
    """One failed check of one node, as the job controller consumes it."""

    address: str
    instance_id: str
    check: str
    value: str
    detail: str


@dataclass
class NodeReport:
    node: Node
    cells: dict[str, Cell] = field(default_factory=dict)
    instance_type: str = ""

    @property
    def ok(self) -> bool:
        return not any(c.failed for c in self.cells.values())

    def failures(self) -> list[NodeFailure]:
        return [NodeFailure(self.node.address, self.node.instance_id, check, c.value, c.detail)
                for check in CHECKS if (c := self.cells.get(check)) is not None and c.failed]


@dataclass
class GateReport:
    nodes: list[NodeReport]
    duration_s: float = 0.0
    jobs: dict[str, str] = field(default_factory=dict)  # "checks"/"allreduce" -> job id
    settings: GateSettings = field(default_factory=GateSettings)

    @property
    def failures(self) -> list[NodeFailure]:
        return [f for n in self.nodes for f in n.failures()]

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def failed_addresses(self) -> list[str]:
        return [n.node.address for n in self.nodes if not n.ok]

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok, "duration_s": round(self.duration_s, 2), "jobs": self.jobs,
            "settings": asdict(self.settings),
            "failures": [asdict(f) for f in self.failures],
            "nodes": [{"rank": n.node.rank, "address": n.node.address,
                       "instance_id": n.node.instance_id, "role": n.node.role,
                       "instance_type": n.instance_type, "ok": n.ok,
                       "checks": {c: asdict(cell) for c, cell in n.cells.items()}}
                      for n in self.nodes],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"


# -- verdicts (pure) --------------------------------------------------------------------------


def gpus_wanted(expected: Expected, registered: int) -> int:
    """The GPUs a node should have: its instance type's, else (type unknown) the count its
    agent registered."""
    return expected.gpus if expected.gpus is not None else registered


def decide_nvidia_smi(found: dict, expected: Expected, registered: int = 0) -> Cell:
    """nvidia-smi must answer on a node that should have GPUs; elsewhere it is informative."""
    status, value, detail = found["status"], str(found.get("value", "")), found.get("detail", "")
    if gpus_wanted(expected, registered) == 0:
        return Cell(NA, "n/a", f"no GPU expected; nvidia-smi: {status} {value} {detail}".strip())
    if status == "ok":
        return Cell(OK, "answers", f"in {found.get('seconds', 0):.2f} s")
    if status == "absent":
        return Cell(FAIL, "absent", detail)
    return Cell(FAIL, value, detail)


def decide_gpus(found: dict, expected: Expected, registered: int) -> Cell:
    """The GPUs nvidia-smi lists equal the instance type's. Without an instance type
    (a membership that has none, no metadata service) the node's registered count is the
    reference, and the detail says so."""
    status = found["status"]
    listed = int(found["value"]) if status == "ok" else (0 if status == "absent" else None)
    if expected.gpus is None:
        if expected.error:
            return Cell(FAIL, f"{'?' if listed is None else listed} (expected ?)", expected.error)
        ref, source = registered, "as registered; instance type unknown"
    else:
        ref, source = expected.gpus, expected.gpus_source
    if listed is None:
        return Cell(SKIP, "-", f"not counted: nvidia-smi {status}")
    if listed != ref:
        return Cell(FAIL, f"{listed} (expected {ref})", f"expected from {source}")
    return Cell(OK, str(listed), f"expected from {source}")


def decide_dcgm(found: dict, expected: Expected, registered: int = 0) -> Cell:
    if gpus_wanted(expected, registered) == 0 or found["status"] == "absent":
        return Cell(NA, "n/a", found.get("detail", "") or "no GPU expected")
    if found["status"] == "ok":
        return Cell(OK, "pass", f"level 1 in {found.get('seconds', 0):.1f} s")
    return Cell(FAIL, str(found.get("value", "")), found.get("detail", ""))


def decide_efa(found: dict, expected: Expected) -> Cell:
    if expected.efa is None:
        return Cell(FAIL, "unknown", expected.error or "EFA attachment unknown")
    if expected.efa == 0:
        return Cell(NA, "n/a", f"no EFA interface attached; devices seen: {found.get('value')}")
    if found["status"] != "ok":
        return Cell(FAIL, str(found.get("value", "")), found.get("detail", ""))
    seen = int(found.get("value") or 0)
    if seen < expected.efa:
        return Cell(FAIL, f"{seen} (expected {expected.efa})",
                    found.get("detail", "") or "no EFA device visible")
    return Cell(OK, str(seen), found.get("detail", ""))


def decide_efs(found: dict, floor_mbps: float) -> Cell:
    if found["status"] != "ok":
        return Cell(FAIL, str(found.get("value", "")), found.get("detail", ""))
    mbps = float(found["value"])
    detail = (f"write {found.get('write_mbps')} MB/s, read {found.get('read_mbps')} MB/s "
              f"({found.get('mib')} MiB); floor {floor_mbps:g} MB/s")
    return Cell(OK if mbps >= floor_mbps else FAIL, f"{mbps:g} MB/s", detail)


def decide_disk(found: dict, floor_mib: float) -> Cell:
    """The node's local disk has at least ``floor_mib`` MiB free (a full disk fails every
    job's status and log writes on that node, whatever the job is)."""
    if found["status"] != "ok":
        return Cell(FAIL, str(found.get("value", "")), found.get("detail", ""))
    free = int(found["value"])
    detail = (f"{free} of {found.get('total_mib', '?')} MiB free on {found.get('detail', '?')}; "
              f"floor {floor_mib:g} MiB")
    return Cell(OK if free >= floor_mib else FAIL, f"{free} MiB free", detail)


def decide_allreduce(found: dict, floor_gbps: float) -> Cell:
    if found["status"] != "ok":
        return Cell(FAIL, str(found.get("value", "")), found.get("detail", ""))
    gbps = float(found["value"])
    return Cell(OK if gbps >= floor_gbps else FAIL, f"{gbps:g} GB/s",
                f"{found.get('detail', '')}; busbw floor {floor_gbps:g} GB/s")


# -- rendering --------------------------------------------------------------------------------


def render_table(report: GateReport) -> str:
    header = ["RANK", "ADDRESS", "TYPE", *(c.upper() for c in CHECKS)]
    body = [[str(n.node.rank), n.node.address, n.instance_type or "?",
             *(n.cells[c].text() if c in n.cells else "-" for c in CHECKS)]
            for n in report.nodes]
    widths = [max(len(x) for x in col) for col in zip(header, *body, strict=True)]
    return "\n".join("  ".join(x.ljust(w) for x, w in zip(line, widths, strict=True)).rstrip()
                     for line in [header, *body]) + "\n"


def summary(report: GateReport) -> str:
    """One line: healthy, or every failing node with its failing checks and values."""
    if report.ok:
        return (f"healthy: {len(report.nodes)} node(s) passed every check in "
                f"{report.duration_s:.1f} s")
    parts = []
    for n in report.nodes:
        bad = n.failures()
        if bad:
            parts.append(f"{n.node.address} ({n.node.instance_id}): "
                         + ", ".join(f"{f.check} {f.value}" for f in bad))
    return (f"UNHEALTHY: {len(parts)} of {len(report.nodes)} node(s) failing after "
            f"{report.duration_s:.1f} s: " + "; ".join(parts))


def details(report: GateReport) -> str:
    """Why each failing check failed (the detail the table has no room for)."""
    return "".join(f"  {f.address} {f.check}: {f.value}: {f.detail}\n"
                   for f in report.failures if f.detail)
