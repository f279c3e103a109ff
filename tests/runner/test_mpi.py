"""The MPI path for real: Open MPI across two emulated nodes, each with its own sshd.

Each node gets an ``sshd -D -f <conf>`` bound to its own 127.21.x address with its own host
key, pid file and authorized_keys (a throwaway key pair made here); ``dl-run --launcher mpi``
publishes one share for the master, whose executor runs mpirun, which reaches the worker
over ssh (``-mca plm_rsh_agent "ssh -F <cfg>"``) exactly as on a real cluster.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from bootstrap_scripts.node.procgroup import alive

pytestmark = pytest.mark.slow

SSHD = shutil.which("sshd") or ("/usr/sbin/sshd" if os.path.exists("/usr/sbin/sshd") else None)
NEEDED = {"sshd": SSHD, "ssh": shutil.which("ssh"), "ssh-keygen": shutil.which("ssh-keygen"),
          "mpirun": shutil.which("mpirun"), "mpicc": shutil.which("mpicc")}
missing = sorted(k for k, v in NEEDED.items() if not v)

HELLO_C = r"""
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
    int rank, size, one, sum;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    one = rank + 1;
    MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    const char *conn = getenv("SSH_CONNECTION");
    printf("hello rank=%d size=%d sum=%d ssh=[%s]\n", rank, size, sum, conn ? conn : "");
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
"""


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _wait_listening(host: str, port: int, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 20
    while True:
        with socket.socket() as s, contextlib.suppress(OSError):
            s.settimeout(0.5)
            s.connect((host, port))
            return
        assert proc.poll() is None, f"sshd on {host}:{port} died:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"sshd on {host}:{port} never listened"
        time.sleep(0.1)


@pytest.mark.skipif(bool(missing), reason=f"missing {', '.join(missing)}: run "
                    "`sudo bash scripts/system-deps.sh` (openssh-server, openmpi-bin, "
                    "libopenmpi-dev)")
def test_mpi_program_runs_across_two_nodes_over_real_sshd(emu, tmp_path):
    c = emu(2)
    master, worker = c.addresses
    ssh_dir = tmp_path / "ssh"
    ssh_dir.mkdir(mode=0o700)
    key = ssh_dir / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    authorized = ssh_dir / "authorized_keys"
    shutil.copy(f"{key}.pub", authorized)
    os.chmod(authorized, 0o600)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation dir

    sshds: list[subprocess.Popen] = []
    ports = {}
    try:
        for addr in (master, worker):
            d = tmp_path / f"sshd-{addr}"
            d.mkdir()
            hostkey = d / "host_ed25519"
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(hostkey)],
                           check=True)
            ports[addr] = _free_port(addr)
            conf = d / "sshd_config"
            conf.write_text(
                f"ListenAddress {addr}:{ports[addr]}\nHostKey {hostkey}\nPidFile {d}/sshd.pid\n"
                f"AuthorizedKeysFile {authorized}\nPasswordAuthentication no\n"
                "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
                "PermitRootLogin prohibit-password\nUseDNS no\nPrintMotd no\n"
                "X11Forwarding no\nLogLevel VERBOSE\n")
            log = d / "sshd.log"
            p = subprocess.Popen([SSHD, "-D", "-e", "-f", str(conf), "-E", str(log)],
                                 start_new_session=True)
            sshds.append(p)
            c.pgids.add(p.pid)
            c.pids.add(p.pid)
            _wait_listening(addr, ports[addr], p, log)

        cfg = ssh_dir / "config"
        cfg.write_text(
            "".join(f"Host {a}\n  Port {ports[a]}\n" for a in ports)
            + f"Host *\n  IdentityFile {key}\n  IdentitiesOnly yes\n  StrictHostKeyChecking no\n"
            "  UserKnownHostsFile /dev/null\n  BatchMode yes\n  LogLevel ERROR\n")
        hello = tmp_path / "hello"
        (tmp_path / "hello.c").write_text(HELLO_C)
        subprocess.run(["mpicc", "-o", str(hello), str(tmp_path / "hello.c")], check=True)

        c.start_executors([master])  # only the master runs a share; mpirun does the rest
        # mpirun without the emulated node's bind shim (docs/emulator.md, "a node's wildcard
        # binds"): its out-of-band listener would be bound to the node's address while it
        # advertises lo's 127.0.0.1, where the worker's orted then finds nothing
        res = c.run("--launcher", "mpi", "--mpi-if-include", "lo", "--env", "LD_PRELOAD=",
                    "--mpi-rsh-agent", f"ssh -F {cfg}", "--", str(hello), timeout=120)
        assert res.returncode == 0, res.stdout
        hellos = re.findall(r"^\[0 (\S+)\] hello rank=(\d) size=2 sum=3 ssh=\[(.*)\]$",
                            res.stdout, re.M)
        assert sorted(h[1] for h in hellos) == ["0", "1"], res.stdout
        # Rank 1 ran on the worker: its orted came in over the worker's own sshd.
        by_rank = {h[1]: h[2] for h in hellos}
        assert by_rank["1"].split()[2:3] == [worker], res.stdout
        worker_log = (tmp_path / f"sshd-{worker}" / "sshd.log").read_text()
        assert "Accepted publickey" in worker_log
        jdir = c.job_dirs()[0]
        assert (jdir / "hostfile").read_text() == f"{master} slots=1\n{worker} slots=1\n"
        assert "-mca plm_rsh_agent" in (jdir / "commands.txt").read_text()
    finally:
        for p in sshds:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in sshds:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    assert not [p.pid for p in sshds if alive(p.pid)]
