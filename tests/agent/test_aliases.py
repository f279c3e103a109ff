"""The original's host names, used the way users' scripts use them.

The original named every node ``deeplearning-worker1`` .. ``deeplearning-worker<N>`` (N =
``DEEPLEARNING_WORKERS_COUNT``, the master included as ``deeplearning-worker1``) plus
``deeplearning-master``, and its examples loop over them::

    for i in $(seq 1 $DEEPLEARNING_WORKERS_COUNT)
    do
    echo "deeplearning-worker$i slots=$DEEPLEARNING_WORKER_GPU_COUNT" >> ./hostfile
    ssh deeplearning-worker$i uptime
    done

These tests apply a membership to a node root with the agent's own code, then run that loop
in a real bash with the node's rendered profile sourced. Names are resolved two ways: by the
C library itself (``getent hosts``) in a private mount namespace where the rendered
``etc/hosts`` is bind-mounted over ``/etc/hosts`` (skipped where mount namespaces are not
available), and by a shell function that reads the rendered file (runs everywhere). A
numbering from 0, or a gap, leaves ``deeplearning-worker<N>`` unresolved and the loop fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from bootstrap_scripts.agent.node_files import apply_membership
from bootstrap_scripts.protocol.membership import Membership, build_membership
from bootstrap_scripts.protocol.paths import HOSTS_FILE, MPI_HOSTFILE, PROFILE_FILE

#: The original's loop: every alias, then the master's own, one ``name address`` per line.
LOOP = """
set -euo pipefail
source "$PROFILE"
for i in $(seq 1 $DEEPLEARNING_WORKERS_COUNT)
do
addr=$(resolve deeplearning-worker$i)
echo "deeplearning-worker$i $addr"
done
addr=$(resolve deeplearning-master)
echo "deeplearning-master $addr"
"""

#: The original Horovod example's hostfile, built by the loop, then resolved line by line.
HOROVOD = """
set -euo pipefail
source "$PROFILE"
cd "$WORK"
for i in $(seq 1 $DEEPLEARNING_WORKERS_COUNT)
do
echo "deeplearning-worker$i slots=$DEEPLEARNING_WORKER_GPU_COUNT" >> ./hostfile
done
while read -r host slots
do
addr=$(resolve "$host")
echo "$addr $slots"
done < ./hostfile
"""

#: Resolution by the C library (``/etc/hosts`` is the rendered file in this namespace).
GETENT = 'resolve() { getent hosts "$1" | { read -r addr _ && echo "$addr"; }; }\n'

#: Resolution by reading the rendered file: the first address listing the name, or failure.
READ_HOSTS = ('resolve() { awk -v name="$1" \'!/^#/ { for (i = 2; i <= NF; i++) '
              'if ($i == name) { print $1; found = 1; exit } } END { exit !found }\' '
              '"$HOSTS"; }\n')


def membership(workers: int) -> Membership:
    """A master and ``workers`` workers whose addresses sort differently as strings."""
    return build_membership(
        cluster_id="dlc", generation=1,
        master={"instance_id": "i-m", "address": "10.0.0.5", "gpus": 4},
        workers=[{"instance_id": f"i-w{k}", "address": f"10.0.128.{k + 2}", "gpus": 4}
                 for k in range(workers)])


def node_root(tmp_path: Path, m: Membership, instance_id: str) -> Path:
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / HOSTS_FILE).write_text("127.0.0.1 localhost\n")
    assert apply_membership(root, m, instance_id=instance_id).status == "applied"
    return root


def _namespace_prefix() -> list[str] | None:
    """argv that runs a command in a private mount namespace, or None where none is allowed."""
    if shutil.which("unshare") is None:
        return None
    prefix = ["unshare", "-m"] if os.geteuid() == 0 else ["unshare", "-r", "-m"]
    probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=10)
    return prefix if probe.returncode == 0 else None


NAMESPACE = _namespace_prefix()


def run_bash(script: str, root: Path, *, libc: bool, work: Path | None = None) -> list[str]:
    """``script`` in bash with the node's profile, resolving through libc or the file; a
    name that does not resolve stops the script (``set -e``) and fails the test."""
    env = {"PATH": "/usr/bin:/bin", "PROFILE": str(root / PROFILE_FILE),
           "HOSTS": str(root / HOSTS_FILE), "WORK": str(work or root)}
    if libc:
        assert NAMESPACE is not None
        mount = 'mount --bind "$HOSTS" /etc/hosts\n'
        argv = [*NAMESPACE, "bash", "-c", mount + GETENT + script]
    else:
        argv = ["bash", "-c", READ_HOSTS + script]
    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, f"loop failed ({res.returncode}): {res.stderr}{res.stdout}"
    return res.stdout.splitlines()


RESOLVERS = [
    pytest.param(True, id="libc", marks=pytest.mark.skipif(
        NAMESPACE is None, reason="no mount namespace here to put the rendered hosts file "
        "at /etc/hosts")),
    pytest.param(False, id="hosts-file"),
]


@pytest.mark.parametrize("libc", RESOLVERS)
@pytest.mark.parametrize("workers", [0, 3, 9])
def test_the_originals_loop_resolves_every_node_master_first(tmp_path, workers, libc):
    m = membership(workers)
    root = node_root(tmp_path, m, "i-m")
    lines = run_bash(LOOP, root, libc=libc)
    expected = [f"deeplearning-worker{n.rank + 1} {n.address}" for n in m.nodes]
    assert lines == [*expected, f"deeplearning-master {m.master_addr}"]
    assert lines[0] == f"deeplearning-worker1 {m.master_addr}"


@pytest.mark.parametrize("libc", RESOLVERS)
def test_the_horovod_examples_hostfile_names_every_node_once(tmp_path, libc):
    m = membership(9)
    root = node_root(tmp_path, m, "i-w3")
    work = tmp_path / "job"
    work.mkdir()
    lines = run_bash(HOROVOD, root, libc=libc, work=work)
    hostfile = (work / "hostfile").read_text().splitlines()
    assert hostfile == [f"deeplearning-worker{i} slots=4" for i in range(1, len(m.nodes) + 1)]
    # Resolved, it is the MPI hostfile the agent wrote (same hosts, same order).
    assert [f"{line.split()[0]} {line.split()[1]}" for line in lines] == \
        (root / MPI_HOSTFILE).read_text().splitlines()
    assert len({line.split()[0] for line in lines}) == len(m.nodes)
