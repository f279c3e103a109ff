"""bootstrap_scripts/slurm: names, the renderers, the reconcile table, the daemons' argv and
the munge key's file (no daemons: fast)."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from bootstrap_scripts.protocol.membership import Membership, Node, alias_for
from bootstrap_scripts.protocol.slurm_paths import SlurmPaths
from bootstrap_scripts.slurm import config, daemons, munge_key, names, prolog, reconcile
from bootstrap_scripts.slurm.reconcile import DELETE, DOWN, DRAIN, Action, SlurmNode


def membership(*addresses: str, generation: int = 3) -> Membership:
    nodes = tuple(Node(rank=i, role="master" if i == 0 else "worker",
                       instance_id=f"i-{i:017d}", address=a, alias=f"deeplearning-worker{i + 1}")
                  for i, a in enumerate(addresses))
    return Membership(cluster_id="c1", generation=generation, nodes=nodes)


def test_node_names_are_ec2_host_names_and_back() -> None:
    assert names.node_name("10.0.1.23") == "ip-10-0-1-23"
    assert names.address_of("ip-10-0-1-23") == "10.0.1.23"
    assert names.address_of("gpu-node-1") is None
    assert names.address_of("ip-10-0-1-999") is None
    with pytest.raises(names.SlurmNameError):
        names.node_name("10.0.1")
    assert names.features("worker", "p4d.24xlarge") == ("worker", "p4d_24xlarge")
    with pytest.raises(names.SlurmNameError):
        names.features("login")


def test_slurm_conf_puts_every_node_local_path_under_the_root_and_state_on_efs() -> None:
    c = config.SlurmConfig(cluster_id="My-Cluster.1", controller_address="10.0.0.5",
                           root="/nodes/a", efs="/shared")
    text = config.render_slurm_conf(c)
    lines = dict(line.split("=", 1) for line in text.splitlines()
                 if "=" in line and not line.startswith("#") and " " not in line.split("=")[0])
    assert lines["ClusterName"] == "my_cluster_1"
    assert lines["SlurmctldHost"] == "ip-10-0-0-5(10.0.0.5)"
    assert lines["SlurmctldParameters"] == "enable_configless"
    assert lines["AuthInfo"] == "socket=/nodes/a/run/munge/munge.socket.2,cred_expire=30"
    assert lines["StateSaveLocation"] == "/shared/cluster/slurm/state"
    assert lines["SlurmdSpoolDir"] == "/nodes/a/var/spool/slurmd"
    for key in ("SlurmctldPidFile", "SlurmdPidFile", "SlurmctldLogFile", "SlurmdLogFile"):
        assert lines[key].startswith("/nodes/a/"), key
    assert "NodeName=" not in text  # dynamic nodes only
    assert "NodeSet=workers Feature=worker" in text
    assert "PartitionName=train Nodes=masters,workers Default=YES" in text
    # the same inputs, the same bytes (slurmctld checks each node's configuration hash)
    assert config.render_slurm_conf(c) == text


def test_a_bad_controller_address_or_node_bound_is_refused() -> None:
    with pytest.raises(ValueError):
        config.SlurmConfig(cluster_id="c", controller_address="master")
    with pytest.raises(config.ConfigError):
        config.SlurmConfig(cluster_id="c", controller_address="10.0.0.1", max_nodes=0)
    with pytest.raises(config.ConfigError):
        config.cluster_name("---")


@pytest.mark.parametrize(("gpus", "line"), [(0, None), (1, "Name=gpu File=/r/dev/nvidia0"),
                                            (8, "Name=gpu File=/r/dev/nvidia[0-7]")])
def test_gres_conf_names_each_gpu_device(gpus: int, line: str | None) -> None:
    text = config.render_gres_conf(gpus, "/r")
    body = [x for x in text.splitlines() if not x.startswith("#")]
    assert body == ([line] if line else [])


def test_slurmd_node_conf_has_features_and_gres() -> None:
    assert config.slurmd_node_conf("worker", "g5.12xlarge", 4) == \
        "Feature=worker,g5_12xlarge Gres=gpu:4"
    assert config.slurmd_node_conf("master", "", 0) == "Feature=master"


def test_reconcile_parses_scontrol_one_line_listing() -> None:
    text = ("NodeName=ip-10-0-0-5 Arch=x86_64 CoresPerSocket=1 State=IDLE+DYNAMIC_NORM "
            "Reason=none\nNodeName=ip-10-0-0-6 State=DOWN*+DRAIN+DYNAMIC_NORM Reason=lost: x "
            "y\n\ngarbage\n")
    nodes = reconcile.parse_nodes(text)
    assert [n.name for n in nodes] == ["ip-10-0-0-5", "ip-10-0-0-6"]
    assert not nodes[0].down and nodes[1].down and nodes[1].draining


def node(name: str, *states: str) -> SlurmNode:
    return SlurmNode(name, frozenset(states or ("IDLE", "DYNAMIC_NORM")))


def test_reconcile_table() -> None:
    m = membership("10.0.0.5", "10.0.0.6", "10.0.0.7", generation=7)
    slurm = [node("ip-10-0-0-5"), node("ip-10-0-0-6"),  # members, registered
             node("ip-10-0-0-9"),                      # left, still up in Slurm
             node("ip-10-0-0-8", "DOWN", "DYNAMIC_NORM"),  # left, already DOWN
             node("login1")]                           # not ours
    actions = reconcile.plan(m, slurm, draining={"i-00000000000000001"},
                             known={"ip-10-0-0-9": "i-0abc"})
    assert actions == [
        Action(DRAIN, "ip-10-0-0-6",
               "drain: instance i-00000000000000001 is leaving the cluster (generation 7)"),
        Action(DELETE, "ip-10-0-0-8"),
        Action(DOWN, "ip-10-0-0-9", "lost: instance i-0abc left the membership (generation 7)"),
        Action(DELETE, "ip-10-0-0-9"),
    ]
    # a member absent from Slurm (10.0.0.7): nothing, it registers itself; a node already
    # draining is not drained again
    again = reconcile.plan(m, [node("ip-10-0-0-6", "IDLE", "DRAIN")],
                           draining={"i-00000000000000001"})
    assert again == []


def test_reconcile_names_an_unknown_instance_by_its_address() -> None:
    actions = reconcile.plan(membership("10.0.0.5"), [node("ip-10-0-0-9")])
    assert actions[0].reason == "lost: instance at 10.0.0.9 left the membership (generation 3)"


def test_scontrol_arguments_keep_the_reason_one_argument() -> None:
    assert reconcile.scontrol_args(Action(DOWN, "ip-1-2-3-4", "lost: a b")) == [
        "update", "NodeName=ip-1-2-3-4", "State=DOWN", "Reason=lost: a b"]
    assert reconcile.scontrol_args(Action(DELETE, "ip-1-2-3-4")) == [
        "delete", "NodeName=ip-1-2-3-4"]


def test_daemons_argv_and_what_each_waits_for(tmp_path) -> None:
    p = SlurmPaths(tmp_path / "root", tmp_path / "efs")
    ns = SimpleNamespace(root=str(p.root), efs=str(p.efs), daemon="slurmd",
                         name="ip-10-0-0-6", node_conf="Feature=worker")
    needs, argv = daemons.plan(ns)
    assert needs == [p.slurm_conf, p.munge_socket]
    assert argv[1:] == ["-D", "-Z", "-N", "ip-10-0-0-6", "-f", str(p.slurm_conf), "--conf",
                        "Feature=worker"]
    ns.daemon = "munged"
    needs, argv = daemons.plan(ns)
    assert needs == [p.munge_key] and f"--socket={p.munge_socket}" in argv
    ns.daemon, ns.name = "slurmd", "node7"
    with pytest.raises(daemons.DaemonError):
        daemons.plan(ns)
    with pytest.raises(daemons.DaemonError, match="still missing"):
        daemons.wait_for([tmp_path / "never"], 0.0)


def test_munge_key_is_0400_munges_and_never_half_written(tmp_path) -> None:
    if os.geteuid() != 0:
        pytest.fail("the munge key is root's to write: run as root")
    munge_key.munge_ids()  # munge is installed (scripts/system-deps.sh)
    p = SlurmPaths(tmp_path)
    key = munge_key.key_bytes("k" * 1024, None)
    written = munge_key.install_key(p, key)
    st = written.stat()
    assert written == tmp_path / "etc/munge/munge.key"
    assert stat.S_IMODE(st.st_mode) == 0o400
    assert (st.st_uid, st.st_gid) == munge_key.munge_ids()
    assert stat.S_IMODE(written.parent.stat().st_mode) == 0o700
    assert written.read_bytes() == key
    assert [x.name for x in written.parent.iterdir()] == ["munge.key"]
    with pytest.raises(munge_key.MungeKeyError):
        munge_key.key_bytes("short", None)
    assert munge_key.key_bytes(None, b"b" * 40) == b"b" * 40


def test_the_units_slurmd_runs_under_the_nodes_name_with_its_gpus() -> None:
    from bootstrap_scripts.agent.install import python_unit
    from bootstrap_scripts.slurm import units
    from emulator.units import restart_policy

    def render(role: str) -> dict[str, str]:
        return units.render_units(python_unit, python="/usr/bin/python3", package_dir="/opt/p",
                                  root="/", efs="/efs", role=role, address="10.0.1.23",
                                  instance_type="g5.12xlarge", gpus=4,
                                  log_dir="/var/log/dl-cluster")

    worker, master = render("worker"), render("master")
    assert sorted(worker) == ["dl-munged.service", "dl-slurmd.service"]
    assert sorted(master) == sorted([*worker, "dl-slurmctld.service"])
    exec_start = next(line for line in worker["dl-slurmd.service"].splitlines()
                      if line.startswith("ExecStart="))
    argv = [a.strip('"') for a in exec_start.removeprefix("ExecStart=").split('" "')]
    assert argv[argv.index("--name") + 1] == "ip-10-0-1-23"
    assert argv[argv.index("--node-conf") + 1] == "Feature=worker,g5_12xlarge Gres=gpu:4"
    assert "KillMode=process" in worker["dl-slurmd.service"]
    assert restart_policy(master["dl-slurmctld.service"]).wants(1)


def test_each_membership_rewrites_only_what_changed(tmp_path) -> None:
    from bootstrap_scripts.slurm import node

    p = SlurmPaths(tmp_path / "root", tmp_path / "efs")
    first = node.write_config(p, "c1", membership("10.0.0.5", "10.0.0.6"), 2)
    assert sorted(x.name for x in first) == ["cgroup.conf", "gres.conf", "prolog.sh",
                                             "slurm.conf", "task_prolog.sh"]
    assert p.task_prolog.stat().st_mode & 0o777 == 0o755
    assert (p.prolog.stat().st_mode & 0o777, p.prolog.stat().st_uid) == (0o755, os.getuid())
    assert f"TaskProlog={p.task_prolog}" in p.slurm_conf.read_text()
    assert node.write_config(p, "c1", membership("10.0.0.5", "10.0.0.7", generation=4), 2) == []
    moved = node.write_config(p, "c1", membership("10.0.0.9", "10.0.0.7", generation=5), 2)
    assert [x.name for x in moved] == ["slurm.conf"]  # a new master: its address
    assert "SlurmctldHost=ip-10-0-0-9(10.0.0.9)" in p.slurm_conf.read_text()


def test_the_task_prolog_gives_a_task_its_own_nodes_variables(tmp_path) -> None:
    """sbatch hands every task the submitter's environment (the master's DEEPLEARNING_*
    from its login shell): the TaskProlog's exports put the task's own node's back, and
    nothing else of the node's environment file."""
    import subprocess

    from bootstrap_scripts.slurm import config

    env = tmp_path / "it's env"
    env.write_text("DEEPLEARNING_NODE_ADDR=10.0.0.6\nDEEPLEARNING_NODE_RANK=1\n"
                   "EFS_MOUNT=/efs\nAWS_REGION=us-east-1\nPATH=/x\n")
    script = tmp_path / "prolog.sh"
    script.write_text(config.render_task_prolog(str(env)))
    script.chmod(0o755)
    out = subprocess.run([str(script)], capture_output=True, text=True, timeout=10)
    assert (out.returncode, out.stdout.splitlines()) == (0, [
        "export DEEPLEARNING_NODE_ADDR=10.0.0.6", "export DEEPLEARNING_NODE_RANK=1",
        "export EFS_MOUNT=/efs"])
    env.unlink()  # a node that has not applied a membership yet: no export, no failure
    out = subprocess.run([str(script)], capture_output=True, text=True, timeout=10)
    assert (out.returncode, out.stdout) == (0, "")


# -- the health gate as Slurm's Prolog --------------------------------------------------------


def test_slurm_conf_runs_the_prolog_on_every_node_at_allocation_bounded_and_unheld() -> None:
    text = config.render_slurm_conf(config.SlurmConfig(
        cluster_id="c", controller_address="10.0.0.5", root="/nodes/a"))
    lines = dict(line.split("=", 1) for line in text.splitlines()
                 if "=" in line and not line.startswith("#") and " " not in line.split("=")[0])
    assert lines["Prolog"] == "/nodes/a/etc/slurm/prolog.sh"
    assert lines["PrologFlags"] == "Alloc,DeferBatch"
    # one line, both settings (Slurm reads the last SchedulerParameters line only)
    assert text.count("\nSchedulerParameters=") == 1
    assert lines["SchedulerParameters"].split(",") == [
        "nohold_on_prolog_fail", "sched_interval=10", "batch_sched_delay=0"]
    # Slurm's own bound is above the prolog's: the prolog's verdict names the check
    assert int(lines["PrologEpilogTimeout"]) > prolog.bound() > 120


def good(check: str, value: object, **extra: object) -> dict:
    return {"check": check, "status": "ok", "value": value, "detail": "", **extra}


HEALTHY = {"nvidia-smi": good("nvidia-smi", 4), "dcgm": good("dcgm", "pass"),
           "efa": good("efa", 0), "efs": good("efs", 80.0, write_mbps=80, read_mbps=90, mib=8),
           "disk": good("disk", 50_000, total_mib=100_000)}


@pytest.mark.parametrize(("change", "gpus", "failed"), [
    ({}, 4, []),
    ({"nvidia-smi": {"check": "nvidia-smi", "status": "error", "value": "exit 9"}}, 4,
     [("nvidia-smi", "exit 9")]),
    ({"nvidia-smi": good("nvidia-smi", 3)}, 4, [("gpus", "3 (expected 4)")]),
    ({"nvidia-smi": None}, 4, [("gpus", "timeout after 10 s"),
                               ("nvidia-smi", "timeout after 10 s")]),
    ({"dcgm": None}, 4, [("dcgm", "timeout after 131 s")]),
    ({"efs": good("efs", 1.5)}, 4, [("efs", "1.5 MB/s")]),
    ({"disk": good("disk", 100)}, 4, [("disk", "100 MiB free")]),
    # a node without GPUs: no driver is no fault
    ({"nvidia-smi": {"check": "nvidia-smi", "status": "absent", "value": "n/a"},
      "dcgm": {"check": "dcgm", "status": "absent", "value": "n/a"}}, 0, []),
])
def test_the_prolog_judges_each_finding_as_the_gate_does(change, gpus, failed) -> None:
    found = {k: v for k, v in {**HEALTHY, **change}.items() if v is not None}
    assert [(f.check, f.value) for f in prolog.decide(found, gpus)] == failed


def test_the_drain_reason_names_the_checks_in_one_printable_bounded_argument() -> None:
    fs = [prolog.Failure("nvidia-smi", "exit 9"), prolog.Failure("efs", "not\nwritable")]
    reason = prolog.drain_reason(fs)
    assert reason == "dl-health: nvidia-smi exit 9; efs not?writable"
    assert len(prolog.drain_reason([prolog.Failure("x", "y" * 500)])) == prolog.MAX_REASON
    assert prolog.drain_args("ip-1-2-3-4", reason) == [
        "update", "NodeName=ip-1-2-3-4", "State=DRAIN", f"Reason={reason}"]


def prolog_node(tmp_path, *, fault: bool) -> tuple[SlurmPaths, Path]:
    """A node root with a membership applied (4 GPUs registered), its stand-in driver (failing
    with ``fault``) and a stand-in ``scontrol`` recording its argv and environment."""
    from bootstrap_scripts.protocol.node_files import render_env_file
    from bootstrap_scripts.protocol.paths import NodePaths
    from bootstrap_scripts.slurm import node as slurm_node
    from emulator.gpus import fake_nvidia_smi, inject_gpu_fault

    root, efs = tmp_path / "root", tmp_path / "efs"
    m = Membership(cluster_id="c1", generation=1, nodes=(
        Node(rank=0, role="master", instance_id="i-0", address="10.0.0.5", alias=alias_for(0),
             gpus=4),
        Node(rank=1, role="worker", instance_id="i-1", address="10.0.0.6", alias=alias_for(1),
             gpus=4)))
    paths = NodePaths(root)
    paths.membership.parent.mkdir(parents=True)
    paths.membership.write_text(m.to_json())
    paths.env.write_text(render_env_file({"DEEPLEARNING_NODE_ADDR": "10.0.0.6"}))
    (root / "var/log/slurm").mkdir(parents=True)
    efs.mkdir()
    bindir = fake_nvidia_smi(root / "usr/bin", 4)
    if fault:
        inject_gpu_fault(root)
    calls = tmp_path / "scontrol.calls"
    (bindir / "scontrol").write_text(f'#!/bin/sh\n{{ echo "$@"; env; }} > {calls}\n')
    (bindir / "scontrol").chmod(0o755)
    sp = SlurmPaths(root, efs)
    slurm_node.write_config(sp, "c1", m, 4)
    return sp, calls


def run_prolog(sp: SlurmPaths, bait) -> subprocess.CompletedProcess:
    """The rendered prolog as slurmd runs it, with a hostile environment and working
    directory besides slurmd's own variables."""
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_USER": "alice", "PATH": str(bait),
           "PYTHONPATH": str(bait), "PYTHONSTARTUP": str(bait / "sitecustomize.py"),
           "PYTHONHOME": str(bait), "BASH_ENV": str(bait / "x.sh"), "ENV": str(bait / "x.sh")}
    return subprocess.run([str(sp.prolog)], env=env, cwd=bait, capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("fault", [False, True])
def test_the_rendered_prolog_passes_or_drains_its_own_node_and_reads_nothing_of_the_job(
        tmp_path, fault: bool) -> None:
    """docs/security.md L44, on one node without daemons: the prolog runs the node's own
    stand-in driver (under its root, first on its fixed PATH), never a ``python`` or
    ``sitecustomize.py`` of the caller's; on a failure it drains its own node (the name from
    its own membership, the reason naming the check) with nothing of the environment it was
    given, and exits 1; healthy, it exits 0 and drains nothing."""
    sp, calls = prolog_node(tmp_path, fault=fault)
    bait = tmp_path / "bait"
    bait.mkdir()
    for name in ("sitecustomize.py", "usercustomize.py"):
        (bait / name).write_text("import os, pathlib\npathlib.Path(__file__).with_name("
                                 "'loaded').touch()\n")
    (bait / "x.sh").write_text(f"touch {bait / 'loaded'}\n")
    for tool in ("python3", "nvidia-smi", "env"):
        (bait / tool).write_text(f"#!/bin/sh\ntouch {bait / 'loaded'}\n")
        (bait / tool).chmod(0o755)
    res = run_prolog(sp, bait)
    assert not (bait / "loaded").exists(), "the prolog ran what its caller chose"
    log = (sp.log_dir / prolog.LOG_NAME).read_text()
    if not fault:
        assert (res.returncode, calls.exists()) == (0, False), (res, log)
        assert "job=42 ok" in log
        return
    assert res.returncode == 1, (res, log)
    argv, _, env = calls.read_text().partition("\n")
    assert argv == ("update NodeName=ip-10-0-0-6 State=DRAIN Reason=dl-health: nvidia-smi "
                    "exit 9; dcgm exit 9")
    names_seen = {line.split("=", 1)[0] for line in env.splitlines() if "=" in line}
    assert names_seen <= {"PATH", "SLURM_CONF", "PWD", "SHLVL", "_"}, env
    assert f"SLURM_CONF={sp.slurm_conf}" in env
    assert "job=42 FAIL" in log and "dl-health: nvidia-smi exit 9" in log


def test_the_master_marks_only_a_workers_own_health_drain_once() -> None:
    from bootstrap_scripts.slurm.node import HealthMarks

    m = membership("10.0.0.5", "10.0.0.6", "10.0.0.7", "10.0.0.8")
    listing = (
        "NodeName=ip-10-0-0-5 State=IDLE+DRAIN Reason=dl-health: disk 9 MiB free "
        "[root@2026-01-01T00:00:00]\n"  # the master: never
        "NodeName=ip-10-0-0-6 State=IDLE+DRAIN+DYNAMIC_NORM Reason=dl-health: nvidia-smi "
        "exit 9; dcgm exit 9 [root@2026-01-01T00:00:00]\n"
        "NodeName=ip-10-0-0-7 State=IDLE+DRAIN Reason=drain: instance i-7 is leaving "
        "[root@2026-01-01T00:00:00]\n"  # not the gate's
        "NodeName=ip-10-0-0-8 State=IDLE Reason=dl-health: efs 1 MB/s [root@2026-01-01T0]\n"
        "NodeName=ip-10-0-0-9 State=IDLE+DRAIN Reason=dl-health: disk 1 MiB free "
        "[root@2026-01-01T00:00:00]\n")  # not a member
    listed = reconcile.parse_nodes(listing)
    assert listed[1].reason == "dl-health: nvidia-smi exit 9; dcgm exit 9"
    assert listed[1].reason_user == "root"
    assert [(n.instance_id, why) for n, why in reconcile.health_drained(m, listed)] == [
        ("i-00000000000000001", "nvidia-smi exit 9; dcgm exit 9")]
    by_user = reconcile.parse_nodes(listing.replace("[root@", "[alice@"))
    assert reconcile.health_drained(m, by_user) == []

    marked: list[str] = []
    health = SimpleNamespace(mark_unhealthy=lambda i: marked.append(i) or "")
    marks = HealthMarks("us-east-1", health=health)
    assert marks.run(m, listed) == [("i-00000000000000001", "nvidia-smi exit 9; dcgm exit 9",
                                     "")]
    assert marks.run(m, listed) == [] and marked == ["i-00000000000000001"]  # once per drain
    marks.run(m, reconcile.parse_nodes("NodeName=ip-10-0-0-6 State=IDLE"))  # resumed
    marks.run(m, listed)  # and drained again
    assert marked == ["i-00000000000000001"] * 2


def test_a_link_in_a_daemon_directorys_place_is_refused_not_followed(tmp_path) -> None:
    """Root hands the daemons' directories over (chown, chmod); slurmctld's state is on EFS,
    which every worker's root can write: a link there must not pass the hand-over on."""
    import pytest

    from bootstrap_scripts.slurm import daemons

    target = tmp_path / "elsewhere"
    target.mkdir()
    target.chmod(0o700)
    link = tmp_path / "state"
    link.symlink_to(target)
    with pytest.raises(daemons.DaemonError, match="not a directory of its own"):
        daemons.own_dir(link, "root", 0o755)
    assert target.stat().st_mode & 0o777 == 0o700  # untouched
