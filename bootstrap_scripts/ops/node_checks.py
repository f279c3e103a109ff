"""The health gate's node-local checks: run on every node as a job share, print what they saw.

    python -m bootstrap_scripts.ops.node_checks --efs /efs [--budget-nvidia-smi 10 ...]

Started by the gate (``ops.gate``) through the job executors (the ``each`` launcher), so no
ssh is involved. Each check runs in its own thread with its own time budget and prints one
line ``DL-HEALTH {json}`` as soon as it has an answer (or its budget ran out); the gate reads
those lines from the share's log on EFS while the others still run. This module only
measures; whether a value passes (the instance type's GPU count, the EFS floor) is decided
on the master by ``ops.gate_report``, which knows what each node should have.

Checks (name: what is measured):
- ``imds``        (only with ``--imds``) the instance type, from the metadata service
- ``nvidia-smi``  ``nvidia-smi -L`` answers: how many GPUs it lists (absent: no driver tool)
- ``dcgm``        ``dcgmi diag -r 1`` where ``dcgmi`` exists and a GPU is listed
- ``efa``         EFA devices: ``/sys/class/infiniband`` entries driven by ``efa``, else
                  the domains ``fi_info -p efa`` lists
- ``efs``         write + fsync + read back ``--efs-mib`` MiB on EFS: write and read MB/s
- ``disk``        free space (MiB, as an unprivileged writer sees it) on the node's local
                  disk: the filesystem of the executor's state (``--disk-path``, default
                  found from the job's ``DEEPLEARNING_MEMBERSHIP_PATH``, else ``/``)
Exit status 0 whatever the checks found (the findings are the output); 2 on bad usage.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from bootstrap_scripts.protocol.paths import ClusterPaths, NodePaths

#: Prefix of every result line in the share's log.
MARKER = "DL-HEALTH "
NODE_CHECKS = ("nvidia-smi", "dcgm", "efa", "efs", "disk")
SYS_INFINIBAND = "/sys/class/infiniband"
CHUNK = 1 << 20


def result(check: str, status: str, value: object = "", detail: str = "",
           seconds: float = 0.0, **extra: object) -> dict:
    """One check's finding. ``status``: ok | error | timeout | absent."""
    return {"check": check, "status": status, "value": value, "detail": detail,
            "seconds": round(seconds, 3), **extra}


def emit(line: dict) -> None:
    sys.stdout.write(MARKER + json.dumps(line, sort_keys=True) + "\n")
    sys.stdout.flush()


def tail(text: str, limit: int = 300) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(lines[-3:])[-limit:]


def run_tool(check: str, argv: list[str], budget: float) -> tuple[dict | None, str]:
    """Run a tool within ``budget`` s: (a finished result if it did not answer, its stdout)."""
    exe = shutil.which(argv[0])
    if exe is None:
        return result(check, "absent", "n/a", f"{argv[0]} not found on PATH"), ""
    t0 = time.monotonic()
    try:
        out = subprocess.run([exe, *argv[1:]], capture_output=True, text=True, timeout=budget,
                             stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        return result(check, "timeout", f"timeout after {budget:g} s",
                      f"{' '.join(argv)} did not answer", time.monotonic() - t0), ""
    except OSError as exc:
        return result(check, "error", "cannot run", str(exc), time.monotonic() - t0), ""
    if out.returncode != 0:
        return result(check, "error", f"exit {out.returncode}",
                      tail(out.stderr or out.stdout), time.monotonic() - t0), out.stdout
    return None, out.stdout


# -- parsing (pure) ------------------------------------------------------------------------


def parse_gpu_list(text: str) -> int:
    """``nvidia-smi -L``: one ``GPU <n>: <name> (UUID: ...)`` line per GPU (MIG lines are not)."""
    return sum(1 for line in text.splitlines() if line.startswith("GPU "))


def parse_dcgm(text: str) -> tuple[bool, str]:
    """``dcgmi diag`` output: (every test passed, what failed). JSON (``-j``) or the table;
    a test whose result is ``Fail`` fails the diagnostic, ``Skip``/``Warn`` do not."""
    with contextlib.suppress(ValueError):
        failed: list[str] = []

        def walk(node: object, name: str = "") -> None:
            if isinstance(node, dict):
                label = str(node.get("test_name") or node.get("name") or name)
                for key in ("status", "result"):
                    if str(node.get(key, "")).lower() == "fail":
                        failed.append(label or "?")
                for value in node.values():
                    walk(value, label)
            elif isinstance(node, list):
                for value in node:
                    walk(value, name)

        walk(json.loads(text))
        return not failed, ", ".join(sorted(set(failed)))
    bad = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[-1].lower().startswith("fail"):
            bad.append(cells[0] or "?")
    return not bad, ", ".join(bad)


def efa_sysfs_devices(base: Path) -> list[str]:
    """Devices under ``/sys/class/infiniband`` whose kernel driver is ``efa``."""
    try:
        entries = sorted(base.iterdir())
    except OSError:
        return []
    found = []
    for dev in entries:
        driver = dev / "device" / "driver"
        with contextlib.suppress(OSError):
            if os.path.basename(os.path.realpath(driver)) == "efa" or dev.name.startswith("efa"):
                found.append(dev.name)
    return found


def parse_fi_info(text: str) -> list[str]:
    """Distinct ``domain:`` values of ``fi_info -p efa`` (one per EFA device and endpoint type)."""
    domains = []
    for line in text.splitlines():
        key, _, value = line.strip().partition(":")
        if key == "domain" and value.strip():
            dom = value.strip().removesuffix("-rdm").removesuffix("-dgrm")
            if dom not in domains:
                domains.append(dom)
    return domains


# -- checks ----------------------------------------------------------------------------------


def check_nvidia_smi(budget: float) -> dict:
    t0 = time.monotonic()
    failed, out = run_tool("nvidia-smi", ["nvidia-smi", "-L"], budget)
    if failed:
        return failed
    return result("nvidia-smi", "ok", parse_gpu_list(out), "", time.monotonic() - t0)


def check_dcgm(budget: float, gpus_listed: int | None) -> dict:
    if gpus_listed == 0:
        return result("dcgm", "absent", "n/a",
                      "no GPU to diagnose (nvidia-smi absent or lists none)")
    t0 = time.monotonic()
    failed, out = run_tool("dcgm", ["dcgmi", "diag", "-r", "1", "--json"], budget)
    ok, what = parse_dcgm(out) if out.strip() else (False, "")
    if failed and not what:  # no test named as failed: the exit status is all we know
        return failed
    return result("dcgm", "ok" if ok else "error", "pass" if ok else "fail",
                  f"failed: {what}" if what else "", time.monotonic() - t0)


def check_efa(budget: float, sys_infiniband: Path) -> dict:
    t0 = time.monotonic()
    devices = efa_sysfs_devices(sys_infiniband)
    if devices:
        return result("efa", "ok", len(devices), ", ".join(devices), time.monotonic() - t0)
    if shutil.which("fi_info") is None:
        return result("efa", "ok", 0, f"no EFA device under {sys_infiniband}, no fi_info")
    failed, out = run_tool("efa", ["fi_info", "-p", "efa"], budget)
    if failed is not None and failed["status"] == "timeout":
        return failed
    domains = parse_fi_info(out)
    return result("efa", "ok", len(domains), ", ".join(domains) or "fi_info lists no efa "
                  "provider", time.monotonic() - t0)


def check_efs(efs: Path, mib: int, tag: str) -> dict:
    """Write ``mib`` MiB, fsync, drop it from the page cache, read it back: MB/s both ways."""
    probe = ClusterPaths(efs).health_probe(tag)
    block = os.urandom(CHUNK)
    size = mib * CHUNK
    try:
        probe.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            for _ in range(mib):
                os.write(fd, block)
            os.fsync(fd)
            with contextlib.suppress(OSError, AttributeError):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        t1 = time.monotonic()
        read = 0
        with open(probe, "rb", buffering=0) as fh:
            while chunk := fh.read(CHUNK):
                read += len(chunk)
        t2 = time.monotonic()
    except OSError as exc:
        return result("efs", "error", "not writable", f"{probe}: {exc}")
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    if read != size:
        return result("efs", "error", "short read", f"wrote {size} bytes, read back {read}")
    mb = size / 1e6
    return result("efs", "ok", round(min(mb / max(t1 - t0, 1e-6), mb / max(t2 - t1, 1e-6)), 1),
                  "", t2 - t0, write_mbps=round(mb / max(t1 - t0, 1e-6), 1),
                  read_mbps=round(mb / max(t2 - t1, 1e-6), 1), mib=mib)


def local_disk_path(env: dict[str, str]) -> Path:
    """The node-local directory whose filesystem ``disk`` measures: the executor's state
    directory (share status files land there), else the nearest parent that exists."""
    try:
        path = NodePaths.of_membership_file(env["DEEPLEARNING_MEMBERSHIP_PATH"]
                                            ).executor_state_dir
    except (KeyError, ValueError):
        path = NodePaths("/").executor_state_dir
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_disk(path: Path) -> dict:
    """Free MiB on ``path``'s filesystem (``f_bavail``: what a non-root writer may still use,
    the reserved blocks left out) and the total; the floor is the master's to apply."""
    t0 = time.monotonic()
    try:
        st = os.statvfs(path)
    except OSError as exc:
        return result("disk", "error", "cannot stat", f"{path}: {exc}", time.monotonic() - t0)
    free_mib = st.f_bavail * st.f_frsize // CHUNK
    total_mib = st.f_blocks * st.f_frsize // CHUNK
    return result("disk", "ok", free_mib, str(path), time.monotonic() - t0,
                  total_mib=total_mib)


def instance_type_from_imds(budget: float) -> dict:
    from bootstrap_scripts.agent.identity import IdentityError, fetch_identity

    endpoint = os.environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT") or "http://169.254.169.254/"
    t0 = time.monotonic()
    try:
        ident = fetch_identity(endpoint, timeout=min(2.0, budget), attempts=1, deadline=budget)
    except IdentityError as exc:
        return result("imds", "error", "", str(exc), time.monotonic() - t0)
    return result("imds", "ok", ident.instance_type, ident.instance_id, time.monotonic() - t0)


# -- running them ------------------------------------------------------------------------------


class Runner:
    """Runs checks in threads; each result is printed once, by the first of: the check
    finishing, or its budget running out (then ``timeout after N s``)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.printed: set[str] = set()
        self.threads: list[tuple[str, threading.Thread, float, float]] = []

    def report(self, line: dict) -> None:
        with self.lock:
            if line["check"] in self.printed:
                return
            self.printed.add(line["check"])
            emit(line)

    def start(self, name: str, budget: float, fn: Callable[[], dict]) -> None:
        def body() -> None:
            try:
                line = fn()
            except Exception as exc:  # a bug in a check must not hide the others
                line = result(name, "error", "check crashed", repr(exc))
            self.report(line)

        t = threading.Thread(target=body, name=name, daemon=True)
        self.threads.append((name, t, time.monotonic(), budget))
        t.start()

    def wait(self) -> None:
        for name, t, started, budget in self.threads:
            t.join(max(0.0, started + budget - time.monotonic()))
            if t.is_alive():
                self.report(result(name, "timeout", f"timeout after {budget:g} s",
                                   "no answer within the budget", budget))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="node_checks", description=__doc__.split("\n\n")[0])
    p.add_argument("--efs", required=True, help="the EFS mount point")
    p.add_argument("--efs-mib", type=int, default=8, help="MiB written and read (default 8)")
    p.add_argument("--budget-nvidia-smi", type=float, default=10.0)
    p.add_argument("--budget-dcgm", type=float, default=120.0)
    p.add_argument("--budget-efa", type=float, default=10.0)
    p.add_argument("--budget-efs", type=float, default=20.0)
    p.add_argument("--budget-disk", type=float, default=5.0)
    p.add_argument("--disk-path", default="", help="a directory on the local disk to measure "
                   "(default: the executor's state directory of this node)")
    p.add_argument("--imds", action="store_true", help="also read the instance type from IMDS")
    p.add_argument("--budget-imds", type=float, default=3.0)
    p.add_argument("--sys-infiniband", default=SYS_INFINIBAND, help=argparse.SUPPRESS)
    p.add_argument("--json", action="store_true", help="(the only output format)")
    ns = p.parse_args(argv)
    if ns.efs_mib < 1:
        p.error(f"--efs-mib must be >= 1, got {ns.efs_mib}")
    return ns


def plan(ns: argparse.Namespace) -> list[tuple[str, float, Callable[[], dict]]]:
    """Each check of ``ns`` as (name, budget, function): what :func:`main` runs here, and
    what Slurm's prolog runs on its node (``bootstrap_scripts.slurm.prolog``)."""
    nvidia = threading.Event()
    listed: list[int | None] = [None]
    tag = f"deep-{os.environ.get('DEEPLEARNING_NODE_ADDR', '') or socket.gethostname()}-" \
        f"{os.getpid()}"

    def nvidia_check() -> dict:
        line = check_nvidia_smi(ns.budget_nvidia_smi)
        listed[0] = line["value"] if line["status"] == "ok" else (
            0 if line["status"] == "absent" else None)
        nvidia.set()
        return line

    def dcgm_check() -> dict:
        nvidia.wait(ns.budget_nvidia_smi + 1)
        return check_dcgm(ns.budget_dcgm, listed[0])

    checks: list[tuple[str, float, Callable[[], dict]]] = [
        ("nvidia-smi", ns.budget_nvidia_smi, nvidia_check),
        ("dcgm", ns.budget_nvidia_smi + 1 + ns.budget_dcgm, dcgm_check),
        ("efa", ns.budget_efa, lambda: check_efa(ns.budget_efa, Path(ns.sys_infiniband))),
        ("efs", ns.budget_efs, lambda: check_efs(Path(ns.efs), ns.efs_mib, tag)),
        ("disk", ns.budget_disk, lambda: check_disk(Path(ns.disk_path) if ns.disk_path
                                                     else local_disk_path(dict(os.environ)))),
    ]
    if ns.imds:
        checks.append(("imds", ns.budget_imds, lambda: instance_type_from_imds(ns.budget_imds)))
    return checks


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    address = os.environ.get("DEEPLEARNING_NODE_ADDR", "")
    emit(result("node", "ok", address, socket.gethostname(), pid=os.getpid()))
    r = Runner()
    for name, budget, fn in plan(ns):
        r.start(name, budget, fn)
    r.wait()
    emit(result("done", "ok"))
    sys.stdout.flush()
    os._exit(0)  # a check stuck in the kernel (a hung NFS write) must not keep us alive


if __name__ == "__main__":
    sys.exit(main())
