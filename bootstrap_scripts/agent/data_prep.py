"""The data-preparation command (``--data-prep``): run once per instance before it may join.

Every node (the master too) runs ``/bin/sh -c <command>`` in a process group of its own,
with ``DL_INSTANCE_ID``, ``DL_NODE_ADDRESS``, ``DL_CLUSTER_ID``, ``DL_ROLE`` and
``EFS_MOUNT`` set and its output appended to ``cluster/prepared/<id>.log`` on EFS. The
outcome is a :class:`~bootstrap_scripts.protocol.records.PrepResult` written as
``<id>.ok`` or ``<id>.failed`` beside it: on EFS, so a restarted agent does not run the
command again and the master (and ``dl-scale --status``) can see it.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from pathlib import Path

from bootstrap_scripts.agent.identity import NodeIdentity
from bootstrap_scripts.agent.settings import AgentConfig
from bootstrap_scripts.node.procgroup import stop_popen_group
from bootstrap_scripts.protocol import state, store
from bootstrap_scripts.protocol.paths import ClusterPaths
from bootstrap_scripts.protocol.records import PrepResult

#: Bytes of the command's output kept in a ``.failed`` record.
TAIL_BYTES = 2000


def tail(path: Path, limit: int = TAIL_BYTES) -> str:
    """The last ``limit`` bytes of ``path`` as text ("" when unreadable)."""
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-limit:].decode("utf-8", errors="replace")


def prepare(config: AgentConfig, identity: NodeIdentity, *, stop: threading.Event,
            log: logging.Logger) -> bool:
    """Run ``config.data_prep`` once per instance; True when ``<id>.ok`` exists.

    False when it failed (``<id>.failed`` written) or when ``stop`` was set while it ran
    (then nothing is recorded and the next agent start runs it again)."""
    paths = ClusterPaths(config.mount_point)
    iid = identity.instance_id
    done = state.prep_status(paths.efs, iid)
    if done is not None:
        log.info("event=data-prep-skipped reason=already-%s", done)
        return done == "ok"
    log_path = paths.prepared_log(iid)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "DL_INSTANCE_ID": iid, "DL_NODE_ADDRESS": identity.address,
           "DL_CLUSTER_ID": config.cluster_id, "DL_ROLE": config.role,
           "EFS_MOUNT": config.mount_point}
    started = time.time()
    log.info("event=data-prep-start command=%r timeout=%.0fs", config.data_prep,
             config.data_prep_timeout)
    error = ""
    with open(log_path, "ab") as out:
        try:
            proc = subprocess.Popen(["/bin/sh", "-c", config.data_prep], stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env, start_new_session=True)
        except OSError as exc:
            proc, error = None, f"cannot start: {exc}"
        give_up = time.monotonic() + config.data_prep_timeout
        while proc is not None and proc.poll() is None:
            if stop.wait(0.1):
                stop_popen_group(proc)
                log.info("event=data-prep-interrupted (will run again at restart)")
                return False
            if time.monotonic() >= give_up:
                stop_popen_group(proc)
                error = f"timed out after {config.data_prep_timeout:.0f}s"
    exit_code = proc.returncode if proc is not None else None
    if not error and exit_code != 0:
        error = f"exit status {exit_code}"
    finished = time.time()
    result = PrepResult(instance_id=iid, address=identity.address, command=config.data_prep,
                        started_at=started, finished_at=finished,
                        seconds=round(finished - started, 3), exit_code=exit_code,
                        error=error, output_tail=tail(log_path) if error else "")
    outcome = "failed" if error else "ok"
    store.write_record(paths.prepared(iid, outcome), result)
    log.log(logging.ERROR if error else logging.INFO,
            "event=data-prep-%s seconds=%.1f exit_code=%s error=%r", outcome, result.seconds,
            exit_code, error)
    return not error
