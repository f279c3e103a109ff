"""Per-launcher command generation: membership + user command -> what each node runs.

Pure functions (no I/O, no torch), so every launcher's commands, hostfiles and TF_CONFIG
can be unit-tested for any cluster shape. The runner writes ``LaunchPlan.files`` into the
job directory on EFS and publishes ``LaunchPlan.shares`` in the job spec.

Two kinds of launcher:
- per-node (torchrun, tf, each): every node's executor starts its own share in parallel;
- master-only (mpi, horovod, mxnet): one process on the master, which reaches the other
  nodes itself over ssh (that is how mpirun / horovodrun / MXNet's launch.py work).
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import replace

from bootstrap_scripts.jobs.engine import tf_launcher
from bootstrap_scripts.jobs.engine.plan_types import (
    LaunchError,
    LaunchOptions,
    LaunchPlan,
    python_command,
)
from bootstrap_scripts.jobs.engine.rdzv_store import RDZV_STORE_LABEL, RDZV_STORE_SCRIPT
from bootstrap_scripts.jobs.engine.torchrun_agent import TORCHRUN_AGENT_SCRIPT
from bootstrap_scripts.protocol.jobs import (
    ADDRESS_PLACEHOLDER,
    RDZV_PORTS,
    UNPRIVILEGED_PORTS,
    Listener,
    Proc,
    Share,
    listen_port_allowed,
)
from bootstrap_scripts.protocol.membership import Membership
from bootstrap_scripts.protocol.nnodes import TORCHRUN, NodeRange, NodeRangeError, node_range
from bootstrap_scripts.protocol.node_files import (
    render_horovod_hosts,
    render_mpi_hostfile,
    render_workers_file,
)

LAUNCHERS = (TORCHRUN, "mpi", "horovod", "tf", "mxnet", "each")
MASTER_ONLY = frozenset({"mpi", "horovod", "mxnet"})

#: Variables mpirun always forwards (as the original did).
MPI_ALWAYS_FORWARD = ("LD_LIBRARY_PATH", "PATH")


def plan(launcher: str, m: Membership, command: list[str], opts: LaunchOptions) -> LaunchPlan:
    if launcher not in LAUNCHERS:
        raise LaunchError(f"unknown launcher {launcher!r}; choose one of {', '.join(LAUNCHERS)}")
    if not command:
        raise LaunchError("no command given: put the training command after the options")
    # An image's interpreter is the image's: a leading ``python`` stays for dl-container.
    command = list(command) if opts.image else node_python(list(command), opts.python)
    return _PLANNERS[launcher](m, command, opts)


def _job_path(opts: LaunchOptions, name: str) -> str:
    return os.path.join(opts.job_dir, name)


#: A bare interpreter name as the command's first word: ``python``, ``python3``, ``python3.11``.
PYTHON_NAME = re.compile(r"python(\d+(\.\d+)?)?")


def node_python(command: list[str], python: str) -> list[str]:
    """A leading bare ``python`` / ``python3`` / ``python3.N`` means the job's interpreter
    (``--python``), for every launcher: which ``python`` a node's PATH finds first (the
    system's, a conda base, none at all) must not decide what runs. A path to an
    interpreter, a script or any other program stays as given."""
    if command and PYTHON_NAME.fullmatch(command[0]):
        return [python, *command[1:]]
    return command


def strip_python(command: list[str], python: str) -> list[str]:
    """torchrun wants ``script args`` or ``-m module args`` and runs them with its own
    interpreter (``--python``); a leading interpreter is dropped when it is that one."""
    if len(command) > 1 and PYTHON_NAME.fullmatch(os.path.basename(command[0])):
        if command[0] != python:
            raise LaunchError(f"torchrun runs the command with the job's interpreter "
                              f"({python}), not {command[0]}: pass --python {command[0]}")
        return command[1:]
    return command


#: The wrapper of every rank of an image job (``bootstrap_scripts/containers/run.py``), by
#: the name the node installer gives it on every node's PATH.
DL_CONTAINER = "dl-container"


def in_image(command: list[str], image: str) -> list[str]:
    """torchrun's worker command for an image job: ``--no-python`` (torchrun starts the
    entry itself) ``dl-container run IMAGE -- CMD``, each rank in the image with torchrun's
    variables passed in; a command without an interpreter runs with the image's ``python``."""
    if not command or not PYTHON_NAME.fullmatch(os.path.basename(command[0])):
        command = ["python", *command]
    return ["--no-python", DL_CONTAINER, "run", image, "--", *command]


# -- torchrun ------------------------------------------------------------------------------


ELASTIC_MAX_RESTARTS = 100
#: The rendezvous's last call for an elastic job (torch's default: 30 s). A new round opens
#: only once every participant of the last one left it (``_RendezvousExitOp``), so all live
#: agents are already on its wait list then, and each looks again within a second
#: (``_DistributedRendezvousOpExecutor``: ``SYNC`` -> ``_delay(1)``): 2 s covers that poll
#: with a second to spare (docs/runner.md, "What was cut").
ELASTIC_LAST_CALL = 2.0
#: A node that stopped heart-beating (its machine gone) leaves the rendezvous after
#: interval x attempts (torch: 5 s x 3); the survivors' next round opens only then.
ELASTIC_KEEP_ALIVE_S = 1
ELASTIC_KEEP_ALIVE_ATTEMPTS = 3


def rdzv_store_proc(opts: LaunchOptions, m: Membership) -> Proc:
    """The master's helper that serves the job's rendezvous store (see ``rdzv_store.py``
    for why no torchrun agent hosts it), on a listening socket the master's root executor
    binds before the share starts (``listen``): no other user's process can be listening
    there instead, which every agent would then take for the job's store."""
    return Proc(argv=(opts.python, RDZV_STORE_SCRIPT, "--host", m.master_addr,
                      "--port", str(opts.rdzv_port)), label=RDZV_STORE_LABEL, wait=False,
                listen=Listener(host=m.master_addr, port=opts.rdzv_port))


#: torchrun's log directory, in the job's directory on EFS.
TORCHELASTIC_DIR = "torchelastic"


def torchrun_argv(opts: LaunchOptions, m: Membership, script: list[str], *, address: str,
                  nproc: int, nnodes: NodeRange, max_restarts: int) -> tuple[str, ...]:
    # No agent hosts the store: it is the master's ``rdzv-store`` process, which outlives
    # every agent, so none of them loses it while closing the rendezvous.
    conf = "is_host=false"
    if opts.rdzv_last_call:
        conf += f",last_call_timeout={opts.rdzv_last_call:g}"
    if opts.elastic:
        # A node that leaves by signal stays a participant of the finished round until its
        # keep-alive expires (torchrun: 5 s x 3, here 1 s x 3); the survivors' next round
        # waits for that.
        conf += (f",keep_alive_interval={ELASTIC_KEEP_ALIVE_S},"
                 f"keep_alive_max_attempt={ELASTIC_KEEP_ALIVE_ATTEMPTS}")
    # Where a node can be a spare, the agent is torchrun with a spare's clean exit
    # (torchrun_agent.py); elsewhere torch's own.
    agent = (TORCHRUN_AGENT_SCRIPT,) if opts.elastic or nnodes.spares(len(m.nodes)) \
        else ("-m", "torch.distributed.run")
    return (
        opts.python, *agent,
        f"--nnodes={nnodes}",
        f"--nproc-per-node={nproc}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={m.master_addr}:{opts.rdzv_port}",
        f"--rdzv-id={opts.job_id}",
        # Explicit: without it an agent whose host name or address matches the endpoint
        # tries to host the store itself (on loopback every node would).
        f"--rdzv-conf={conf}",
        f"--local-addr={address}",
        f"--max-restarts={max_restarts}",
        # torchrun's own logs and error files: without a directory it makes a new
        # /tmp/torchelastic_* on every node for every run and never removes it; under the
        # job's directory they stay with the job (and go with it).
        *([f"--log-dir={_job_path(opts, TORCHELASTIC_DIR)}"] if opts.job_dir else []),
        *script,
    )


def torchrun_plan(m: Membership, command: list[str], opts: LaunchOptions) -> LaunchPlan:
    """One torchrun agent per node, every one a client of the rendezvous store that the
    master's share serves from a process of its own (``rdzv-store``, next to the master's
    agent). Elastic: ``--nnodes 1:MAX`` by default (any node but the master may leave; the
    master holds the rendezvous store and is protected from scale-in); a MAX below the
    node count makes the nodes beyond it spares (``NodeRange.spares``), generous
    ``--max-restarts`` (a leaving node fails its peers' all-reduce, which torchrun counts
    as a restart), a short last call (a re-rendezvous after a join or
    leave completes seconds after the nodes are there, not 30 s) and a join template."""
    if opts.max_restarts < 0:
        raise LaunchError(f"--max-restarts must be >= 0, got {opts.max_restarts}")
    if not listen_port_allowed(opts.rdzv_port):
        raise LaunchError(f"--rdzv-port must be in the rendezvous window {RDZV_PORTS[0]}-"
                          f"{RDZV_PORTS[-1]} (only root can bind these: the default) or "
                          f"{UNPRIVILEGED_PORTS[0]}-{UNPRIVILEGED_PORTS[-1]}, got "
                          f"{opts.rdzv_port}")
    if opts.rdzv_last_call < 0:
        raise LaunchError(f"rendezvous last call must be >= 0 s, got {opts.rdzv_last_call}")
    try:  # the one rule of --nnodes and its defaults (``protocol.nnodes``)
        nnodes = node_range(opts.nnodes, len(m.nodes), elastic=opts.elastic)
    except NodeRangeError as exc:
        raise LaunchError(str(exc)) from None
    spare = nnodes.spares(len(m.nodes))
    max_restarts = opts.max_restarts
    if opts.elastic:
        max_restarts = opts.max_restarts or ELASTIC_MAX_RESTARTS
        opts = opts if opts.rdzv_last_call else replace(opts, rdzv_last_call=ELASTIC_LAST_CALL)
    script = in_image(command, opts.image) if opts.image else strip_python(command, opts.python)
    # torch 2.x shares the rendezvous TCPStore with the workers and publishes its address
    # only in the FIRST round: a node joining a later round waits for a key that the
    # (unchanged) rank 0 never writes again, and the round times out. Without sharing,
    # every round publishes it. Needed for nodes to join a running job.
    env = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"} if opts.elastic else {}
    shares = []
    for node in m.nodes:
        argv = torchrun_argv(opts, m, script, address=node.address,
                             nproc=opts.nproc_per_node or node.slots, nnodes=nnodes,
                             max_restarts=max_restarts)
        procs = (Proc(argv=argv, env=dict(env)),)
        if node.rank == 0:
            procs += (rdzv_store_proc(opts, m),)
        shares.append(Share(node.rank, node.address, procs))
    template = None
    if opts.elastic:
        # Joining nodes are CPU or GPU alike: 0 = torchrun's "gpu" auto-detection would
        # differ from the others' explicit count, so use the same rule as for the members.
        nproc = opts.nproc_per_node or m.nodes[-1].slots
        template = Proc(argv=torchrun_argv(opts, m, script, address=ADDRESS_PLACEHOLDER,
                                           nproc=nproc, nnodes=nnodes,
                                           max_restarts=max_restarts), env=dict(env))
    return LaunchPlan(
        TORCHRUN, tuple(shares), False,
        summary=f"torchrun on {len(m.nodes)} node(s), nnodes={nnodes}, "
        f"rendezvous c10d at {m.master_addr}:{opts.rdzv_port}"
        + (f", elastic (max restarts {max_restarts})" if opts.elastic else "")
        + (f", {spare} spare node(s) waiting to take a lost node's place" if spare and
           opts.elastic else f", {spare} node(s) beyond --nnodes idle" if spare else ""),
        join_template=template, nnodes=str(nnodes),
    )


# -- mpi / horovod -------------------------------------------------------------------------


def total_slots(m: Membership) -> int:
    return sum(n.slots for n in m.nodes)


def mpi_argv(m: Membership, command: list[str], opts: LaunchOptions, hostfile: str) -> list[str]:
    argv = [opts.mpirun]
    if opts.allow_run_as_root:
        argv.append("--allow-run-as-root")
    argv += ["-np", str(total_slots(m)), "--hostfile", hostfile,
             "-bind-to", "none", "-map-by", "slot", "-mca", "pml", "ob1", "-mca", "btl", "^openib"]
    if opts.mpi_if_include:
        argv += ["-mca", "btl_tcp_if_include", opts.mpi_if_include,
                 "-mca", "oob_tcp_if_include", opts.mpi_if_include]
    elif opts.mpi_if_exclude:
        argv += ["-mca", "btl_tcp_if_exclude", opts.mpi_if_exclude]
    if opts.mpi_rsh_agent:
        argv += ["-mca", "plm_rsh_agent", opts.mpi_rsh_agent]
    if opts.nccl_socket_ifname:
        argv += ["-x", f"NCCL_SOCKET_IFNAME={opts.nccl_socket_ifname}"]
    for var in _forwarded(opts):
        argv += ["-x", var]
    argv += list(opts.mpi_extra)
    argv += python_command(command, opts.python)
    return argv


def _forwarded(opts: LaunchOptions) -> list[str]:
    out: list[str] = []
    for var in (*MPI_ALWAYS_FORWARD, *opts.forward_env):
        if var not in out:
            out.append(var)
    return out


def mpi_plan(m: Membership, command: list[str], opts: LaunchOptions) -> LaunchPlan:
    hostfile = _job_path(opts, "hostfile")
    argv = mpi_argv(m, command, opts, hostfile)
    master = m.master
    return LaunchPlan(
        "mpi", (Share(master.rank, master.address, (Proc(argv=tuple(argv)),)),), True,
        files={"hostfile": render_mpi_hostfile(m)},
        summary=f"mpirun from the master {master.address}: {total_slots(m)} process(es) on "
        f"{len(m.nodes)} node(s)",
    )


def horovod_hosts_arg(m: Membership) -> str:
    return ",".join(line for line in render_horovod_hosts(m).splitlines() if line)


def horovod_plan(m: Membership, command: list[str], opts: LaunchOptions) -> LaunchPlan:
    argv = [opts.horovodrun, "-np", str(total_slots(m)), "-H", horovod_hosts_arg(m)]
    if opts.mpi_if_include:
        argv += ["--network-interface", opts.mpi_if_include]
    mpi_args = ["-bind-to", "none", "-map-by", "slot",
                "-mca", "pml", "ob1", "-mca", "btl", "^openib"]
    if not opts.mpi_if_include and opts.mpi_if_exclude:
        mpi_args += ["-mca", "btl_tcp_if_exclude", opts.mpi_if_exclude]
    if opts.mpi_rsh_agent:
        mpi_args += ["-mca", "plm_rsh_agent", opts.mpi_rsh_agent]
    if opts.allow_run_as_root:
        mpi_args.append("--allow-run-as-root")
    for var in _forwarded(opts):
        mpi_args += ["-x", var]
    argv += [f"--mpi-args={' '.join(shlex.quote(a) for a in mpi_args)}"]
    argv += python_command(command, opts.python)
    master = m.master
    return LaunchPlan(
        "horovod", (Share(master.rank, master.address, (Proc(argv=tuple(argv)),)),), True,
        files={"horovod_hosts": render_horovod_hosts(m)},
        summary=f"horovodrun from the master {master.address}: {total_slots(m)} process(es)",
    )


# -- mxnet / each --------------------------------------------------------------------------


def mxnet_plan(m: Membership, command: list[str], opts: LaunchOptions) -> LaunchPlan:
    workers = _job_path(opts, "workers")
    argv = (opts.python, opts.mxnet_launch, "-n", str(len(m.nodes)), "-H", workers,
            "--launcher", "ssh", *command)
    master = m.master
    return LaunchPlan(
        "mxnet", (Share(master.rank, master.address, (Proc(argv=argv),)),), True,
        files={"workers": render_workers_file(m)},
        summary=f"MXNet launch.py from the master {master.address} on {len(m.nodes)} node(s)",
    )


def each_plan(m: Membership, command: list[str], opts: LaunchOptions) -> LaunchPlan:
    """The command as given, once on every node (with its DEEPLEARNING_* environment)."""
    shares = tuple(Share(n.rank, n.address, (Proc(argv=tuple(command)),)) for n in m.nodes)
    return LaunchPlan("each", shares, False,
                      summary=f"the command once on each of {len(m.nodes)} node(s)")


def tf_plan(m: Membership, command: list[str], opts: LaunchOptions) -> LaunchPlan:
    """TensorFlow: one task per node (or PS + workers), in ``tf_launcher``."""
    return tf_launcher.tf_plan(m, command, opts)


_PLANNERS = {
    TORCHRUN: torchrun_plan,
    "mpi": mpi_plan,
    "horovod": horovod_plan,
    "tf": tf_plan,
    "mxnet": mxnet_plan,
    "each": each_plan,
}
