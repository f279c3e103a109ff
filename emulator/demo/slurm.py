"""``--scheduler slurm``: the demo's job through Slurm, as a cluster user submits it.

The stack is deployed with ``-c scheduler=slurm``; every node boots from its user data into
Slurm (the installer's munged, slurmctld and slurmd units). Once the cluster formed, the demo
waits until every member is idle in Slurm, then a real unprivileged user of this machine
(made for the run, ``dldemo<hex>``, removed at the end) submits the DDP recipe
``bootstrap_scripts/examples/train_digits.sbatch`` unchanged with ``sbatch``, from the master
shell ``--keep`` prints (``emulator/demo/shell.py``). The demo follows the job's output file
and Slurm's record of it (``scontrol show job``), and reports who ran it on which nodes.

Two things of this machine are shared with its user for the run, because an instance has
them anyway: the work directory is traversable by all (munged refuses a socket below a
directory that is not; an instance's ``/`` is 0755), and so are the directories above the
interpreter and this checkout (on a DLAMI the interpreter is not under ``/root``). What the
demo opened is put back by the teardown and by ``--stop`` (``opened`` in state.json).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import secrets
import stat
import subprocess
import time
from pathlib import Path

from bootstrap_scripts.protocol.slurm_paths import SlurmPaths
from bootstrap_scripts.slurm import names, node, reconcile
from emulator import deploy as dp
from emulator import slurm_node
from emulator.demo import shell
from emulator.demo.context import DemoContext, DemoError
from emulator.demo.joblog import JobRun
from emulator.nodes import PYTHON

SBATCH = dp.REPO_ROOT / "bootstrap_scripts/examples/train_digits.sbatch"
#: how long the members may take to be idle in Slurm once the cluster formed
IDLE_TIMEOUT_S = 120
#: a bound on the whole job (the example takes seconds per epoch; a hang must end the demo,
#: with its teardown, before a caller's own bound on the demo kills it)
JOB_TIMEOUT_S = 240
#: ``srun -l`` puts the task's number before each line of its output; the demo reads it as
#: it reads dl-run's ``[rank host]`` prefix (one task per node: task N on the Nth node)
LABEL_RE = re.compile(r"^\s*(\d+): ")
#: the states of a job that has not ended
RUNNING_STATES = ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED")


def deploy_context(ns) -> dict[str, str]:
    return {"scheduler": "slurm"} if getattr(ns, "scheduler", "native") == "slurm" else {}


def wanted(ns) -> bool:
    return getattr(ns, "scheduler", "native") == "slurm"


def open_dirs(paths: list[Path]) -> dict[str, int]:
    """Every directory above (and at) ``paths`` traversable by others; {dir: its old mode}
    for the ones this changed."""
    opened: dict[str, int] = {}
    for target in paths:
        for d in [target, *target.parents]:
            if not d.is_dir() or str(d) in opened:
                continue
            mode = stat.S_IMODE(os.stat(d).st_mode)
            if mode & stat.S_IXOTH:
                continue
            os.chmod(d, mode | stat.S_IXOTH)
            opened[str(d)] = mode
    return opened


def close_dirs(opened: dict[str, int]) -> None:
    for d, mode in opened.items():
        with contextlib.suppress(OSError):
            os.chmod(d, mode)


def prepare(ctx: DemoContext) -> None:
    """Before the nodes boot: their tree traversable (munged), the interpreter reachable;
    a work directory too long for slurmstepd's sockets under its node roots is refused."""
    longest = ctx.work / "nodes" / ("i-" + "0" * 17)  # EC2's instance ids: i- and 17 hex
    if len(str(longest)) + slurm_node.SOCKET_TAIL > slurm_node.MAX_SOCKET_PATH:
        raise DemoError(f"--scheduler slurm: the work directory {ctx.work} is too long "
                        f"({len(str(ctx.work))} characters) for slurmstepd's sockets under "
                        f"the node roots; use a shorter --work-dir (or TMPDIR), e.g. /tmp/dl")
    work_mode = stat.S_IMODE(os.stat(ctx.work).st_mode)
    if not work_mode & 0o005:
        ctx.slurm["opened"][str(ctx.work)] = work_mode
        os.chmod(ctx.work, work_mode | 0o055)
    ctx.slurm["opened"].update(open_dirs([
        ctx.work, Path(os.path.realpath(PYTHON)).parent, Path(PYTHON).parent, dp.REPO_ROOT]))
    ctx.save_state()


def add_user() -> pwd.struct_passwd:
    """A new unprivileged user with a home to submit from. ``useradd`` gives up at once
    when another one holds ``/etc/passwd``'s lock, so it is tried again a few times."""
    name = f"dldemo{secrets.token_hex(3)}"
    for _ in range(20):
        res = subprocess.run(["useradd", "--create-home", "--user-group", "--shell", "/bin/sh",
                              name], capture_output=True, text=True, check=False)
        if res.returncode == 0:
            return pwd.getpwnam(name)
        time.sleep(0.5)
    raise DemoError(f"useradd {name} failed: {res.stderr.strip()}")


def remove_user(name: str) -> None:
    for _ in range(20):
        if subprocess.run(["userdel", "--remove", name], capture_output=True,
                          check=False).returncode in (0, 6):  # 6: no such user
            return
        time.sleep(0.5)


def cleanup(ctx: DemoContext) -> None:
    """The teardown's part: the demo's user gone, the directories it opened closed."""
    if ctx.slurm.get("user"):
        remove_user(ctx.slurm["user"])
    close_dirs({d: m for d, m in ctx.slurm.get("opened", {}).items()
                if d != str(ctx.work) or not ctx.kept})


def cleanup_from_state(state: dict) -> None:
    """``--stop``'s part, from what state.json recorded."""
    slurm = state.get("slurm") or {}
    if slurm.get("user"):
        remove_user(slurm["user"])
    close_dirs(slurm.get("opened") or {})


def scontrol_env(ctx: DemoContext) -> dict[str, str]:
    master = ctx.master()
    if master is None:
        raise DemoError("no live master node: Slurm's controller runs there")
    return node.slurm_env(SlurmPaths(master.root, ctx.efs))


def wait_idle(ctx: DemoContext) -> None:
    """Every member idle in Slurm (its slurmd registered and the controller took it)."""
    want = [names.node_name(n.address) for n in ctx.live_nodes()]
    ctx.step(f"waiting for {len(want)} node(s) to be idle in Slurm (sinfo)")
    t = time.monotonic()
    deadline = t + IDLE_TIMEOUT_S
    while True:
        listed = {x.name: x for x in reconcile.list_nodes("scontrol", scontrol_env(ctx)) or []}
        if all("IDLE" in getattr(listed.get(x), "states", ()) for x in want):
            break
        if time.monotonic() > deadline:
            seen = {x: sorted(getattr(listed.get(x), "states", ()) or ["absent"]) for x in want}
            raise DemoError(f"not every node idle in Slurm after {IDLE_TIMEOUT_S} s: {seen}; "
                            f"see {ctx.logs} and <node>/var/log/slurm/")
        time.sleep(0.25)
    ctx.timings["slurm_idle_s"] = round(time.monotonic() - t, 2)
    ctx.ok(f"Slurm: {', '.join(want)} idle")


def show_job(ctx: DemoContext, job: str) -> dict[str, str]:
    """``scontrol show job -o ID`` as fields (empty when the controller does not answer)."""
    res = subprocess.run(["scontrol", "show", "job", "-o", job], env=scontrol_env(ctx),
                         capture_output=True, text=True, timeout=30, check=False)
    fields = dict(f.split("=", 1) for f in res.stdout.split() if "=" in f)
    if "launch failed" in res.stdout:
        fields["Held"] = "launch failed"
    return fields


def as_user(ctx: DemoContext, argv: list[str], *, timeout: float = 60
            ) -> subprocess.CompletedProcess:
    """``argv`` in the master shell, as the demo's user, in their home (a login's env)."""
    user = pwd.getpwnam(ctx.slurm["user"])
    env = {"HOME": user.pw_dir, "USER": user.pw_name, "LOGNAME": user.pw_name,
           "SHELL": "/bin/sh", "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    return subprocess.run([str(ctx.slurm["shell"]), *argv], env=env, cwd=user.pw_dir,
                          user=user.pw_uid, group=user.pw_gid, extra_groups=[], text=True,
                          capture_output=True, timeout=timeout, check=False)


def run_job(ctx, show_line) -> JobRun:
    """Submit the recipe as the demo's user and follow it to its end; ``show_line`` takes
    each line of the job's output as the dl-run job's lines are taken."""
    wait_idle(ctx)
    master = ctx.master()
    user = add_user()
    ctx.slurm["user"] = user.pw_name
    ctx.save_state()
    env = {**ctx.aws, "AWS_EC2_METADATA_SERVICE_ENDPOINT": master.imds_url}
    path, _ = shell.write_node_shell(ctx.work, "master", master.root, master.address, env)
    ctx.slurm["shell"] = str(path)
    world = len(ctx.live_nodes())
    args = ["--epochs", str(ctx.ns.epochs), "--require-acc", str(ctx.ns.require_acc)]
    ctx.step(f"as user {user.pw_name} on the master: sbatch --nodes={world} "
             f"{SBATCH.relative_to(dp.REPO_ROOT)} {' '.join(args)}")
    t = time.monotonic()
    res = as_user(ctx, ["sbatch", "--parsable", f"--nodes={world}", str(SBATCH), *args])
    if res.returncode != 0:
        raise DemoError(f"sbatch failed (exit {res.returncode}): {res.stderr.strip()}")
    job_id = res.stdout.strip().split(";")[0]
    run = JobRun(job_id=job_id, how="sbatch")
    ctx.info(f"job {job_id} (Slurm)")
    out = Path(user.pw_dir) / f"digits-ddp_{job_id}.out"
    offset, state, fields = 0, "", {}
    deadline = t + JOB_TIMEOUT_S
    with open(ctx.logs / f"slurm-job-{job_id}.log", "w") as log:
        while True:
            fields = show_job(ctx, job_id)
            state = fields.get("JobState", "")
            offset = follow(out, offset, run, show_line, log)
            if (state and state not in RUNNING_STATES) or "Held" in fields:
                break
            if time.monotonic() > deadline:
                subprocess.run(["scancel", job_id], env=scontrol_env(ctx), check=False,
                               capture_output=True, timeout=30)
                state = f"not ended after {JOB_TIMEOUT_S} s (cancelled)"
                break
            time.sleep(0.5)
        follow(out, offset, run, show_line, log)
    ok = state == "COMPLETED"
    run.finish(0 if ok else 1, time.monotonic() - t)
    acct = as_user(ctx, ["sacct", "-j", job_id, "-n", "-X", "-o", "JobID,User,NNodes,State"])
    ctx.slurm["job"] = {"job_id": job_id, "state": state, "user": fields.get("UserId", ""),
                        "nodes": fields.get("NodeList", ""),
                        "num_nodes": int(fields.get("NumNodes", "0").split("-")[0] or 0),
                        "exit_code": fields.get("ExitCode", ""), "output": str(out),
                        "sacct": (acct.stdout + acct.stderr).strip()}
    if not ok:
        run.failure = f"Slurm job {job_id}: {state or 'no record'} {fields.get('Held', '')}"
    return run


def follow(out: Path, offset: int, run: JobRun, show_line, log) -> int:
    """The job's output file from ``offset``: each whole new line shown; the new offset."""
    try:
        with open(out, "rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return offset
    end = data.rfind(b"\n") + 1
    for raw in data[:end].decode(errors="replace").splitlines():
        line = LABEL_RE.sub(r"[\1 task\1] ", raw)
        log.write(raw + "\n")
        run.keep_line(line)
        show_line(line, run)
    return offset + end


def stop_daemons(ctx: DemoContext) -> set[int]:
    """Every node's Slurm (slurmstepd and the job's tasks leave their slurmd's group)."""
    left: set[int] = set()
    for n in ctx.nodes:
        if slurm_node.installed_units(n.root):
            left |= slurm_node.stop(n.address, grace=10)
    return left
