"""Did the kernel's OOM killer run while a share ran? Root's evidence, from ``/proc/vmstat``.

WHY: a rank the kernel kills for memory dies of SIGKILL, and a launcher above it (torchrun)
then exits 1: the job's log says "exited with code 1", and its user looks for a bug. The
kernel counts every OOM kill on the node (``oom_kill`` in ``/proc/vmstat``, Linux 4.13+);
the executor reads the counter as a share starts and as it ends, and a failed share during
which it rose says so in its exit's reason. The counter is the node's: another process
killed meanwhile is counted too, so the reason says "on this node". The failure stays the
job's (``user-code``): a job that asks for more memory than the node has is not the node's
fault.
"""

from __future__ import annotations

from pathlib import Path

VMSTAT = Path("/proc/vmstat")


def parse_oom_kills(text: str) -> int | None:
    """The ``oom_kill`` counter of a ``/proc/vmstat`` text (None: the kernel has none)."""
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None


def oom_kills(path: Path = VMSTAT) -> int | None:
    try:
        return parse_oom_kills(path.read_text())
    except OSError:
        return None


def oom_reason(before: int | None, after: int | None, returncode: int) -> str:
    """What a share's exit says of the OOM killer ("" when nothing to say): only a failed
    share, and only when the node's counter rose while it ran."""
    if returncode == 0 or before is None or after is None or after <= before:
        return ""
    n = after - before
    return (f"the kernel's OOM killer killed {n} process{'es' if n > 1 else ''} on this node "
            f"while the share ran: out of memory")
