"""Helpers for the kept emulated cluster of ``tests/cli`` (its fixture: tests/cli/conftest.py)."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO_ROOT
from tests.support.demo import demo_env

#: The demo job's accuracy target: out of reach in 2 epochs, so the kept cluster's first job
#: fails as a new user's might.
UNREACHABLE_ACC = "0.99"
#: The kept cluster's data bucket and prefix (``-c dataBucket=… -c dataPrefix=…``): the nodes
#: may read that prefix and nothing else of the bucket, as on AWS; the bucket itself is made
#: by the test that fills it (a stack takes an existing bucket's name, made before or after).
DATA_BUCKET = "dl-demo-datasets"
DATA_PREFIX = "e2e/"


def demo_stop(state_path: Path, *extra: str) -> subprocess.CompletedProcess:
    """``make demo ARGS="--stop STATE"`` (``extra``: e.g. ``--keep-files``)."""
    return subprocess.run([sys.executable, "-m", "emulator.demo", "--stop", str(state_path),
                           *extra], cwd=REPO_ROOT, env=demo_env(), capture_output=True,
                          text=True, timeout=120)


def state_groups(state_path: Path) -> set[int]:
    """Every process group the kept cluster's state file records (nodes, moto, service)."""
    with contextlib.suppress(OSError, ValueError):
        state = json.loads(state_path.read_text())
        groups = {n["group"]["pid"] for n in state["nodes"] if n.get("group")}
        groups.add(state["cloud"]["pid"])
        if state.get("service"):
            groups.add(state["service"]["pid"])
        return groups
    return set()


def readme_dlc_line(start: str, user: str = "", job: str = "") -> list[str]:
    """The README's ``dlc`` command that starts with ``start`` (in its "From your laptop"
    block), as written: its comment dropped, ``USER`` replaced by ``user`` and ``<job id>``
    by ``job``; the words after ``dlc``."""
    import shlex

    readme = (Path(REPO_ROOT) / "README.md").read_text()
    heading = re.search(r"^#+ From your laptop: `dlc`$", readme, re.M)
    assert heading, "README has no \"From your laptop: `dlc`\" section"
    block = readme[heading.end():].split("```bash", 1)[1].split("```", 1)[0]
    (line,) = [ln for ln in block.splitlines() if ln.startswith(start)]
    words = shlex.split(line.split("  #", 1)[0].replace("<job id>", job or "JOB"))
    assert words[0] == "dlc", line
    return [user if w == "USER" else w for w in words[1:]]
