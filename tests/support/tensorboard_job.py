"""A managed job's directory owned by a real user, and its TensorBoard started as root
starts it, for the tests that look at a job's TensorBoard (the browser test, the secret
drill).

:func:`tensorboard_job` makes a fresh EFS directory (``/tmp``, mode 755) holding
``managed/<user>/<job>/`` as the controller leaves it for the job's user: the directory (0700) and
its ``request.json``, both owned by that user. :meth:`BoardJob.start` runs ``dl-jobs
tensorboard`` as root (as the operator channel runs it); on exit the board is stopped with
``dl-jobs tensorboard --stop``, whatever is left of its process group is killed, the root
service's record of it removed and the directory deleted, even when the test failed.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bootstrap_scripts import tensorboard_log
from bootstrap_scripts.ops import tensorboard_server as tb
from bootstrap_scripts.protocol.job_paths import ManagedPaths
from bootstrap_scripts.protocol.paths import ClusterPaths
from tests.conftest import REPO_ROOT


@dataclass
class BoardJob:
    """One managed job of ``user`` on the EFS directory ``efs``, and its TensorBoard."""

    efs: Path
    job_id: str
    user: pwd.struct_passwd
    paths: ManagedPaths
    #: what ``dl-jobs tensorboard`` printed (None until :meth:`start`)
    served: dict | None = None

    def user_env(self) -> dict[str, str]:
        """The environment of a process of the job's user writing the job's event files
        (``DL_TENSORBOARD_DIR``, as the controller sets it)."""
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": self.user.pw_dir,
                "PYTHONPATH": REPO_ROOT,
                tensorboard_log.DIR_ENV: str(self.paths.tensorboard_dir)}

    def dl_jobs(self, *args: str) -> subprocess.CompletedProcess:
        """``dl-jobs tensorboard <job> ARGS`` as root."""
        return subprocess.run([sys.executable, "-m", "bootstrap_scripts.jobs.cli.dl_jobs",
                               "--mount-point", str(self.efs), "tensorboard", self.paths.key,
                               *args], capture_output=True, text=True, timeout=90,
                              cwd=REPO_ROOT)

    def start(self, port: int) -> dict:
        """Start the job's TensorBoard on the first free port from ``port``; what
        ``dl-jobs tensorboard`` answered."""
        res = self.dl_jobs("--port", str(tb.pick_port(port)), "--minutes", "5")
        assert res.returncode == 0, res.stderr
        self.served = json.loads(res.stdout)
        return self.served

    def stop(self) -> None:
        if self.served is None:
            return
        self.dl_jobs("--stop")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.served["pid"], signal.SIGKILL)  # whatever --stop left
        with contextlib.suppress(OSError):
            (tb.ROOT_STATE_DIR / self.paths.user / f"{self.paths.job_id}.json").unlink()


@contextlib.contextmanager
def tensorboard_job(user: pwd.struct_passwd, job_id: str, *, prefix: str,
                    efs: Path | None = None) -> Iterator[BoardJob]:
    """A managed job ``job_id`` of ``user`` (``managed/<user>/<job_id>/``) on a fresh EFS
    directory (``prefix``: its name's start in /tmp), or on ``efs`` (another job's: the
    caller removes it); its TensorBoard stopped and a fresh directory removed on exit."""
    fresh = efs is None
    efs = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp")) if efs is None else efs
    job = None
    try:
        os.chmod(efs, 0o755)
        paths = ClusterPaths(efs).managed(f"{user.pw_name}/{job_id}")
        paths.dir.parent.mkdir(parents=True, exist_ok=True)
        paths.dir.mkdir(mode=0o700)
        paths.request.write_text("{}")
        for p in (paths.dir, paths.request):
            os.chown(p, user.pw_uid, user.pw_gid)
        job = BoardJob(efs, job_id, user, paths)
        yield job
    finally:
        if job is not None:
            job.stop()
        if fresh:
            shutil.rmtree(efs, ignore_errors=True)
