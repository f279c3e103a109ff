"""``make demo ARGS="--stop STATE"`` counts the process groups it actually stopped: a state
file whose recorded groups all ended says that nothing was running, not "stopped 5"."""

from __future__ import annotations

import io
import json
import subprocess
import sys

from rich.console import Console

from bootstrap_scripts.node.procgroup import Tracked, start_time, stop_popen_group
from emulator.demo.orchestration import stop_from_state


def state_file(tmp_path, groups: list[Tracked]):
    work = tmp_path / "work"
    (work / "efs").mkdir(parents=True)
    path = work / "state.json"
    path.write_text(json.dumps({
        "work_dir": str(work), "remove_work_dir": False,
        "nodes": [{"instance_id": f"i-{g.pid}", "group": g.to_dict()} for g in groups],
        "runners": []}))
    return path


def stop(path) -> tuple[int, str]:
    buf = io.StringIO()
    code = stop_from_state(str(path), Console(file=buf, width=200))
    return code, buf.getvalue()


def test_groups_that_had_ended_are_not_counted_as_stopped(tmp_path):
    ended = []
    for _ in range(3):
        p = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
        started = start_time(p.pid)
        p.wait()
        ended.append(Tracked("node", p.pid, started))
    code, out = stop(state_file(tmp_path, ended))
    assert code == 0, out
    assert "nothing was running (the 3 recorded process group(s) had ended)" in out
    assert "stopped 3" not in out


def test_a_running_group_is_counted(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                         start_new_session=True)
    try:
        gone = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
        gone_started = start_time(gone.pid)
        gone.wait()
        code, out = stop(state_file(tmp_path, [Tracked("node", p.pid, start_time(p.pid)),
                                               Tracked("node", gone.pid, gone_started)]))
        assert code == 0, out
        assert "stopped 1 process group(s)" in out
        assert p.wait(timeout=30) is not None
    finally:
        stop_popen_group(p)
