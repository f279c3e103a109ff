"""Every launcher's generated commands, hostfiles and TF_CONFIG for 1, 2, 5 nodes x 0, 1, 8 GPUs."""

from __future__ import annotations

import inspect
import json
import re
import shlex

import pytest

from bootstrap_scripts.jobs.engine import launchers as ln
from bootstrap_scripts.jobs.engine import rdzv_store
from bootstrap_scripts.protocol.jobs import Listener
from bootstrap_scripts.protocol.membership import build_membership
from bootstrap_scripts.protocol.nnodes import parse_nnodes

NODES = [1, 2, 5]
GPUS = [0, 1, 8]


def cluster(n: int, gpus: int):
    return build_membership(
        cluster_id="c", generation=3,
        master={"instance_id": "i-m", "address": "10.0.0.4", "gpus": gpus},
        # deliberately unsorted, and 10.0.1.10 after 10.0.1.9 numerically
        workers=[{"instance_id": f"i-{k}", "address": f"10.0.1.{10 - k}", "gpus": gpus}
                 for k in range(n - 1)],
    )


def opts(**kw) -> ln.LaunchOptions:
    base = {"job_id": "job-1", "job_dir": "/efs/jobs/job-1", "python": "/usr/bin/python3"}
    return ln.LaunchOptions(**{**base, **kw})


shape = pytest.mark.parametrize(("n", "gpus"), [(n, g) for n in NODES for g in GPUS])


def flag(argv, name):
    """Value of ``--name=value`` in argv (exactly one occurrence)."""
    values = [a.split("=", 1)[1] for a in argv if a.startswith(f"--{name}=")]
    assert len(values) == 1, (name, argv)
    return values[0]


@shape
def test_torchrun_one_agent_per_node_same_rendezvous(n, gpus):
    m = cluster(n, gpus)
    plan = ln.plan("torchrun", m, ["train.py", "--epochs", "3"], opts(max_restarts=2))
    assert not plan.master_only
    assert [s.address for s in plan.shares] == [node.address for node in m.nodes]
    for share, node in zip(plan.shares, m.nodes, strict=True):
        proc, *helpers = share.procs
        argv = proc.argv
        assert argv[:3] == ("/usr/bin/python3", "-m", "torch.distributed.run")
        assert flag(argv, "nnodes") == str(n)
        assert flag(argv, "nproc-per-node") == str(max(1, gpus))
        assert flag(argv, "rdzv-backend") == "c10d"
        # the rendezvous window's first port: only root can bind it (docs/security.md)
        assert flag(argv, "rdzv-endpoint") == "10.0.0.4:294"
        assert flag(argv, "rdzv-id") == "job-1"
        assert flag(argv, "local-addr") == node.address
        assert flag(argv, "max-restarts") == "2"
        # No agent hosts the store (it would take it away when it exits first): the
        # master's share serves it from a helper that the executor stops last.
        assert flag(argv, "rdzv-conf") == "is_host=false"
        # torchrun's logs under the job's directory, never a /tmp/torchelastic_* of its own
        assert flag(argv, "log-dir") == "/efs/jobs/job-1/torchelastic"
        assert argv[-3:] == ("train.py", "--epochs", "3")
        if node.rank == 0:
            (store,) = helpers
            assert store.label == rdzv_store.RDZV_STORE_LABEL and not store.wait
            assert store.argv == ("/usr/bin/python3", rdzv_store.RDZV_STORE_SCRIPT,
                                  "--host", "10.0.0.4", "--port", "294")
            # the master's root executor binds it before the share starts
            assert store.listen == Listener(host="10.0.0.4", port=294)
            assert proc.listen is None
        else:
            assert helpers == [] and proc.listen is None


def test_torchrun_ranks_are_sorted_numerically():
    plan = ln.plan("torchrun", cluster(5, 0), ["t.py"], opts())
    assert [s.address for s in plan.shares] == ["10.0.0.4", "10.0.1.7", "10.0.1.8", "10.0.1.9",
                                                "10.0.1.10"]


def test_torchrun_elastic_and_module_and_python_prefix():
    m = cluster(2, 0)
    plan = ln.plan("torchrun", m, ["python3", "-m", "pkg.train"],
                   opts(nnodes="1:4", nproc_per_node=3, rdzv_port=29500))
    argv = plan.shares[1].procs[0].argv
    assert flag(argv, "nnodes") == "1:4"
    assert flag(argv, "nproc-per-node") == "3"
    assert flag(argv, "rdzv-endpoint") == "10.0.0.4:29500"
    assert argv[-2:] == ("-m", "pkg.train")


def test_an_elastic_job_s_rendezvous_timings():
    """The elastic rendezvous: a 2 s last call, a silent node gone after 1 s x 3; a last call
    given with ``--rdzv-last-call`` wins, and a job that is not elastic keeps torch's."""
    m = cluster(3, 0)
    argv = ln.plan("torchrun", m, ["t.py"], opts(elastic=True)).shares[1].procs[0].argv
    assert flag(argv, "rdzv-conf") == ("is_host=false,last_call_timeout=2,"
                                       "keep_alive_interval=1,keep_alive_max_attempt=3")
    argv = ln.plan("torchrun", m, ["t.py"],
                   opts(elastic=True, rdzv_last_call=5)).shares[1].procs[0].argv
    assert "last_call_timeout=5," in flag(argv, "rdzv-conf")
    argv = ln.plan("torchrun", m, ["t.py"], opts()).shares[1].procs[0].argv
    assert flag(argv, "rdzv-conf") == "is_host=false"


def test_the_elastic_last_call_outlasts_torch_s_rendezvous_poll():
    """The 2 s last call is safe because a waiting agent looks at the rendezvous again within
    1 s (torch 2.13: ``_DistributedRendezvousOpExecutor.run``, ``SYNC`` -> ``_delay(seconds=1)``).
    A torch that polls less often needs a longer last call: this fails then."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    source = inspect.getsource(dynamic_rendezvous._DistributedRendezvousOpExecutor.run)
    polls = re.findall(r"action == _Action\.SYNC:.*?_delay\(seconds=([\d.]+)\)", source,
                       re.DOTALL)
    assert polls == ["1"], polls
    assert float(polls[0]) + 1.0 <= ln.ELASTIC_LAST_CALL
    # the dead node's expiry is torch's keep_alive_interval x keep_alive_max_attempt
    assert "keep_alive_interval * self._settings.keep_alive_max_attempt" in \
        inspect.getsource(dynamic_rendezvous._BackendRendezvousStateHolder._sanitize)


@pytest.mark.parametrize("port", [22, 293, 310, 1023, 0, 65536])
def test_torchrun_refuses_a_privileged_port_outside_the_window(port):
    """Root binds the store's port: a user must not have it bind e.g. sshd's 22."""
    with pytest.raises(ln.LaunchError, match=f"rendezvous window 294-309.*got {port}"):
        ln.plan("torchrun", cluster(2, 0), ["t.py"], opts(rdzv_port=port))


@pytest.mark.parametrize("bad", ["0", "4:2", "a", "1:2:3", "-1:2"])
def test_torchrun_rejects_bad_nnodes_naming_it(bad):
    with pytest.raises(ln.LaunchError, match=repr(bad).replace("'", "'")):
        ln.plan("torchrun", cluster(2, 0), ["t.py"], opts(nnodes=bad))


@shape
def test_mpi_hostfile_and_original_flags(n, gpus):
    m = cluster(n, gpus)
    plan = ln.plan("mpi", m, ["train.py", "--lr", "0.1"], opts(forward_env=("FOO",)))
    assert plan.master_only
    (share,) = plan.shares
    assert share.rank == 0 and share.address == "10.0.0.4"
    slots = max(1, gpus)
    expected = [f"{node.address} slots={slots}" for node in m.nodes]
    assert plan.files["hostfile"].splitlines() == expected
    argv = list(share.procs[0].argv)
    cmd = " ".join(argv)
    assert argv[0] == "mpirun"
    assert f"-np {n * slots} --hostfile /efs/jobs/job-1/hostfile" in cmd
    assert ("-bind-to none -map-by slot -mca pml ob1 -mca btl ^openib "
            "-mca btl_tcp_if_exclude lo,docker0") in cmd
    assert "-x NCCL_SOCKET_IFNAME=^docker0 -x LD_LIBRARY_PATH -x PATH -x FOO" in cmd
    assert "--allow-run-as-root" not in argv
    assert argv[-4:] == ["/usr/bin/python3", "train.py", "--lr", "0.1"]


def test_mpi_loopback_overrides_and_rsh_agent_and_root():
    plan = ln.plan("mpi", cluster(2, 0), ["./hello"],
                   opts(mpi_if_include="lo", mpi_rsh_agent="ssh -F /tmp/cfg",
                        allow_run_as_root=True))
    argv = list(plan.shares[0].procs[0].argv)
    cmd = shlex.join(argv)
    assert "btl_tcp_if_exclude" not in cmd
    assert "-mca btl_tcp_if_include lo -mca oob_tcp_if_include lo" in cmd
    assert argv[argv.index("plm_rsh_agent") + 1] == "ssh -F /tmp/cfg"
    assert argv[1] == "--allow-run-as-root"
    assert argv[-1] == "./hello"  # not a python script: no interpreter prefix


@shape
def test_horovod_hosts(n, gpus):
    m = cluster(n, gpus)
    plan = ln.plan("horovod", m, ["train.py"], opts())
    argv = list(plan.shares[0].procs[0].argv)
    slots = max(1, gpus)
    assert argv[:5] == ["horovodrun", "-np", str(n * slots), "-H",
                        ",".join(f"{node.address}:{slots}" for node in m.nodes)]
    assert plan.files["horovod_hosts"] == "".join(f"{node.address}:{slots}\n" for node in m.nodes)
    mpi_args = next(a for a in argv if a.startswith("--mpi-args="))
    assert "-mca btl_tcp_if_exclude lo,docker0" in mpi_args
    assert argv[-2:] == ["/usr/bin/python3", "train.py"]


@shape
def test_tf_multi_worker(n, gpus):
    m = cluster(n, gpus)
    plan = ln.plan("tf", m, ["train.py"], opts())
    assert len(plan.shares) == n
    expected_cluster = {"worker": [f"{node.address}:2222" for node in m.nodes]}
    assert json.loads(plan.files["tf_cluster.json"]) == expected_cluster
    for share, node in zip(plan.shares, m.nodes, strict=True):
        (proc,) = share.procs
        cfg = json.loads(proc.env["TF_CONFIG"])
        assert cfg == {"cluster": expected_cluster, "task": {"type": "worker", "index": node.rank}}
        assert proc.argv == ("/usr/bin/python3", "train.py")


@shape
def test_tf_parameter_server_matches_generate_trainer(n, gpus):
    m = cluster(n, gpus)
    plan = ln.plan("tf", m, ["train.py"], opts(tf_mode="ps"))
    slots = max(1, gpus)
    cluster_spec = json.loads(plan.files["tf_cluster.json"])
    assert cluster_spec["ps"] == [f"{node.address}:2222" for node in m.nodes]
    assert cluster_spec["worker"] == [f"{node.address}:{2230 + g}" for node in m.nodes
                                      for g in range(slots)]
    seen_workers = []
    for share, node in zip(plan.shares, m.nodes, strict=True):
        ps, *workers = share.procs
        assert ps.label == "ps" and not ps.wait
        assert json.loads(ps.env["TF_CONFIG"])["task"] == {"type": "ps", "index": node.rank}
        assert len(workers) == slots
        for g, w in enumerate(workers):
            task = json.loads(w.env["TF_CONFIG"])["task"]
            assert task["type"] == "worker"
            assert cluster_spec["worker"][task["index"]] == f"{node.address}:{2230 + g}"
            assert w.env.get("CUDA_VISIBLE_DEVICES") == (str(g) if gpus else None)
            seen_workers.append(task["index"])
    assert seen_workers == list(range(n * slots))


def test_tf_rejects_unknown_mode():
    with pytest.raises(ln.LaunchError, match="'async'"):
        ln.plan("tf", cluster(2, 0), ["t.py"], opts(tf_mode="async"))


@shape
def test_mxnet_launch_command(n, gpus):
    m = cluster(n, gpus)
    plan = ln.plan("mxnet", m, ["python", "train.py", "--kv-store", "dist_sync"],
                   opts(mxnet_launch="/opt/mxnet/tools/launch.py"))
    assert plan.master_only and len(plan.shares) == 1
    assert plan.files["workers"] == "".join(f"{node.address}\n" for node in m.nodes)
    assert list(plan.shares[0].procs[0].argv) == [
        "/usr/bin/python3", "/opt/mxnet/tools/launch.py", "-n", str(n), "-H",
        "/efs/jobs/job-1/workers", "--launcher", "ssh", "/usr/bin/python3", "train.py",
        "--kv-store", "dist_sync"]


@shape
def test_each_runs_command_verbatim_on_every_node(n, gpus):
    plan = ln.plan("each", cluster(n, gpus), ["hostname"], opts())
    assert [s.procs[0].argv for s in plan.shares] == [("hostname",)] * n


def test_unknown_launcher_and_empty_command_are_named():
    with pytest.raises(ln.LaunchError, match="'slurm'"):
        ln.plan("slurm", cluster(1, 0), ["t.py"], opts())
    with pytest.raises(ln.LaunchError, match="no command"):
        ln.plan("torchrun", cluster(1, 0), [], opts())


@pytest.mark.parametrize("launcher", ln.LAUNCHERS)
@pytest.mark.parametrize("word", ["python", "python3", "python3.11"])
def test_a_leading_python_is_the_jobs_interpreter_for_every_launcher(launcher, word):
    """``dl-run -- python -m pkg.mod`` runs ``--python`` on every node, whatever ``python``
    the node's PATH would find; torchrun runs the module with it directly."""
    plan = ln.plan(launcher, cluster(2, 0), [word, "-m", "pkg.mod", "--x"],
                   opts(python="/opt/env/bin/python3"))
    argv = plan.shares[0].procs[0].argv
    assert word not in argv
    if launcher == "torchrun":
        assert argv[0] == "/opt/env/bin/python3" and argv[-3:] == ("-m", "pkg.mod", "--x")
        assert argv.count("/opt/env/bin/python3") == 1
    else:
        assert argv[-4:] == ("/opt/env/bin/python3", "-m", "pkg.mod", "--x")


def test_an_interpreter_path_runs_as_given_except_under_torchrun():
    plan = ln.plan("each", cluster(2, 0), ["/opt/other/bin/python", "t.py"], opts())
    assert plan.shares[0].procs[0].argv == ("/opt/other/bin/python", "t.py")
    with pytest.raises(ln.LaunchError, match="pass --python /opt/other/bin/python"):
        ln.plan("torchrun", cluster(2, 0), ["/opt/other/bin/python", "t.py"], opts())
    same = ln.plan("torchrun", cluster(2, 0), ["/usr/bin/python3", "t.py"], opts())
    assert same.shares[0].procs[0].argv[-1] == "t.py"


def test_an_elastic_job_with_max_below_the_node_count_has_spares():
    """Nodes beyond ``--nnodes`` MAX are spares: every node still gets an agent (torchrun's
    rendezvous keeps the extra ones on its redundancy list), and the agent of an elastic job
    is torchrun with the spare's clean exit; a job that is not elastic runs torch's own."""
    m = cluster(4, 0)
    plan = ln.plan("torchrun", m, ["t.py"], opts(elastic=True, nnodes="1:3"))
    assert len(plan.shares) == 4
    for share in plan.shares:
        argv = share.procs[0].argv
        assert argv[:2] == ("/usr/bin/python3", ln.TORCHRUN_AGENT_SCRIPT)
        assert argv[1].endswith("/jobs/engine/torchrun_agent.py")
        assert flag(argv, "nnodes") == "1:3"
    assert plan.join_template is not None
    assert plan.join_template.argv[1] == ln.TORCHRUN_AGENT_SCRIPT
    assert "1 spare node(s)" in plan.summary
    assert "spare" not in ln.plan("torchrun", m, ["t.py"], opts(elastic=True)).summary
    assert [parse_nnodes(v).spares(4) for v in ("1:3", "2:4", "1:64")] == [1, 0, 0]
    plain = ln.plan("torchrun", m, ["t.py"], opts()).shares[0].procs[0].argv
    assert plain[1:3] == ("-m", "torch.distributed.run")
    # not elastic, --nnodes below the node count: the extra agents idle on the redundancy
    # list and must exit cleanly too
    fixed = ln.plan("torchrun", m, ["t.py"], opts(nnodes="3"))
    assert fixed.shares[0].procs[0].argv[1] == ln.TORCHRUN_AGENT_SCRIPT
    assert "1 node(s) beyond --nnodes idle" in fixed.summary
    assert [parse_nnodes(v).spares(4) for v in ("3", "4")] == [1, 0]
    with pytest.raises(ln.LaunchError, match="1 <= MIN <= MAX"):
        ln.plan("torchrun", m, ["t.py"], opts(elastic=True, nnodes="3:2"))


def test_the_spare_agent_turns_torch_s_none_into_a_success(tmp_path):
    """``torchrun_agent.patch_graceful_exit`` on the real torch: an agent whose ``run`` meets
    the graceful exit (a spare when the job closes the rendezvous) returns a succeeded
    result instead of None, and a result from ``run`` passes through unchanged. In a child
    interpreter: the patch changes torch's class for the whole process."""
    import subprocess
    import sys

    code = r'''
import sys
from bootstrap_scripts.jobs.engine import torchrun_agent as ta
from torch.distributed.elastic.agent.server import api
from torch.distributed.elastic.rendezvous import RendezvousGracefulExitError

class Agent(api.SimpleElasticAgent):
    outcome = None
    def __init__(self):
        self._shutdown_calls = 0
        self._shutdown_timeout = 1
        self._total_execution_time = 0
    def _invoke_run(self, role="default"):
        if self.outcome is None:
            raise RendezvousGracefulExitError("closed")
        return self.outcome
    def _record_metrics(self, result): pass
    def _record_worker_events(self, result): pass
    def _shutdown(self, *a, **k): self._shutdown_calls += 1
    def _start_workers(self, wg): pass
    def _stop_workers(self, wg): pass
    def _monitor_workers(self, wg): pass

assert Agent().run() is None  # torch as it is: the graceful exit returns None
assert ta.patch_graceful_exit() and ta.patch_graceful_exit()  # twice: applied once
r = Agent().run()
assert r is not None and r.state == api.WorkerState.SUCCEEDED and not r.is_failed(), r
failed = api.RunResult(state=api.WorkerState.FAILED)
a = Agent(); a.outcome = failed
assert a.run() is failed
print("ok")
'''
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stdout + p.stderr
    assert "was a spare" in p.stderr


IMAGE = "nvcr.io/nvidia/pytorch:24.05@sha256:" + "ef" * 32


@pytest.mark.parametrize(("command", "inside"), [
    (["train.py", "--lr", "1"], ["python", "train.py", "--lr", "1"]),
    (["python3", "-m", "pkg.train"], ["python3", "-m", "pkg.train"]),
    (["-m", "pkg.train"], ["python", "-m", "pkg.train"]),
])
def test_an_image_jobs_ranks_each_run_in_dl_container(command, inside):
    """torchrun stays on the host (the rendezvous, the elastic agent); each rank it starts is
    ``dl-container run IMAGE -- CMD``, the command run by the image's interpreter."""
    m = cluster(2, 8)
    plan = ln.plan("torchrun", m, command, opts(image=IMAGE, elastic=True))
    for argv in [*(s.procs[0].argv for s in plan.shares), plan.join_template.argv]:
        worker = list(argv[argv.index("--no-python"):])
        assert worker == ["--no-python", "dl-container", "run", IMAGE, "--", *inside]
        assert argv[0] == "/usr/bin/python3"  # the agent: the node's interpreter, outside
