"""The EMR EFS bootstrap action (bootstrap_scripts/emr/efs_mount.sh) with its commands faked
on PATH.

``aws``, ``mount``, ``mountpoint``, ``chown``, ``sleep``, ``sudo`` and ``dnf`` are small
scripts in a temp bin dir that record their arguments; ``mount`` "mounts" by appending a line
to a fake /proc/mounts (EFS_PROC_MOUNTS), so the script's own check is what is tested.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from constructs_lib.package_paths import node_scripts_dir

SCRIPT = node_scripts_dir() / "emr" / "efs_mount.sh"
FS_ID = "fs-0123456789abcdef0"
REGION = "us-east-1"
NFS_OPTIONS = "nfsvers=4.1,rsize=1048576,wsize=1048576,hard,timeo=600,retrans=2,noresvport"


class Fakes:
    def __init__(self, tmp: Path) -> None:
        self.bin = tmp / "bin"
        self.state = tmp / "state"
        self.mount_point = tmp / "efs"
        self.proc_mounts = self.state / "proc_mounts"
        self.bin.mkdir()
        self.state.mkdir()
        self.proc_mounts.write_text("proc /proc proc rw 0 0\n")
        log = self.state
        tools = {
            # describe-file-systems: "creating" until the call number FS_READY_AFTER;
            # describe-mount-targets: $MT_STATES (default "available available").
            "aws": f"""#!/bin/bash
echo "$*" >> {log}/aws.calls
case "$2" in
describe-file-systems)
  n=$(cat {log}/fs.count 2>/dev/null || echo 0); n=$((n+1)); echo $n > {log}/fs.count
  if [ "$n" -ge "${{FS_READY_AFTER:-1}}" ] && [ "${{FS_READY_AFTER:-1}}" != never ]; then
    echo available; else echo creating; fi ;;
describe-mount-targets)
  echo "${{MT_STATES-available	available}}" ;;
*) echo "unexpected aws call: $*" >&2; exit 1 ;;
esac
""",
            "mount": f"""#!/bin/bash
echo "$*" >> {log}/mount.calls
if [ -n "${{MOUNT_FAILS:-}}" ]; then echo "mount.nfs4: access denied by server" >&2; exit 32; fi
for last; do :; done
[ -n "${{MOUNT_NOOP:-}}" ] || echo "server:/ $last nfs4 rw 0 0" >> {self.proc_mounts}
""",
            "mountpoint": f"""#!/bin/bash
for last; do :; done
awk -v mp="$last" '$2 == mp {{ f = 1 }} END {{ exit !f }}' {self.proc_mounts}
""",
            "chown": f"#!/bin/bash\necho \"$*\" >> {log}/chown.calls\n",
            "sleep": f"#!/bin/bash\necho \"$*\" >> {log}/sleep.calls\n",
            "sudo": f"#!/bin/bash\necho \"$*\" >> {log}/sudo.calls\nexec \"$@\"\n",
            "dnf": f"#!/bin/bash\necho \"$*\" >> {log}/dnf.calls\nexit 1\n",
        }
        for name, body in tools.items():
            path = self.bin / name
            path.write_text(body)
            path.chmod(0o755)

    def with_efs_utils(self) -> None:
        path = self.bin / "mount.efs"
        path.write_text("#!/bin/bash\nexit 0\n")
        path.chmod(0o755)

    def calls(self, tool: str) -> list[str]:
        path = self.state / f"{tool}.calls"
        return path.read_text().splitlines() if path.exists() else []

    def run(self, *args: str, **env: str) -> subprocess.CompletedProcess:
        environ = {
            "PATH": f"{self.bin}:/usr/bin:/bin",
            "HOME": str(self.state),
            "EFS_PROC_MOUNTS": str(self.proc_mounts),
            "EFS_WAIT_ATTEMPTS": "5",
            "EFS_WAIT_INTERVAL": "7",
            **env,
        }
        argv = list(args) if args else [FS_ID, REGION, str(self.mount_point)]
        return subprocess.run(["bash", str(SCRIPT), *argv], env=environ, capture_output=True,
                              text=True, timeout=60, check=False)


@pytest.fixture()
def fakes(tmp_path: Path) -> Fakes:
    return Fakes(tmp_path)


def test_script_is_shipped_executable_and_parses() -> None:
    assert os.access(SCRIPT, os.X_OK)
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_success_waits_for_the_file_system_then_mounts_nfs_and_chowns(fakes: Fakes) -> None:
    proc = fakes.run(FS_READY_AFTER="3")
    assert proc.returncode == 0, proc.stderr
    # Three file-system checks (two "creating"), two sleeps of the configured interval.
    fs_checks = [c for c in fakes.calls("aws") if c.startswith("efs describe-file-systems")]
    assert len(fs_checks) == 3
    assert f"--region {REGION} --file-system-id {FS_ID}" in fs_checks[0]
    assert any(c.startswith("efs describe-mount-targets") and FS_ID in c
               for c in fakes.calls("aws"))
    assert fakes.calls("sleep") == ["7", "7"]
    # No efs-utils (and dnf cannot install it): NFS 4.1 with AWS's options.
    assert fakes.calls("mount") == [
        f"-t nfs4 -o {NFS_OPTIONS} {FS_ID}.efs.{REGION}.amazonaws.com:/ {fakes.mount_point}"]
    assert fakes.calls("chown") == [f"hadoop:hadoop {fakes.mount_point}"]
    assert fakes.mount_point.is_dir()
    assert f"mounted {FS_ID} at {fakes.mount_point}" in proc.stdout


def test_success_uses_efs_utils_with_tls_and_iam_when_present(fakes: Fakes) -> None:
    fakes.with_efs_utils()
    proc = fakes.run()
    assert proc.returncode == 0, proc.stderr
    assert fakes.calls("mount") == [f"-t efs -o tls,iam {FS_ID}:/ {fakes.mount_point}"]
    assert fakes.calls("dnf") == []  # nothing to install


def test_waits_for_mount_targets_not_only_the_file_system(fakes: Fakes) -> None:
    proc = fakes.run(MT_STATES="creating\tavailable", EFS_WAIT_ATTEMPTS="3")
    assert proc.returncode == 3
    assert "mount targets of" in proc.stdout and "creating" in proc.stdout
    assert fakes.calls("mount") == []


def test_file_system_never_available_fails_with_a_clear_message(fakes: Fakes) -> None:
    proc = fakes.run(FS_READY_AFTER="never", EFS_WAIT_ATTEMPTS="4")
    assert proc.returncode == 3
    assert f"EFS {FS_ID} in {REGION}" in proc.stderr
    assert "not available after 4 checks" in proc.stderr
    assert len(fakes.calls("sleep")) == 3
    assert fakes.calls("mount") == [] and fakes.calls("chown") == []


def test_no_mount_targets_at_all_is_waited_for(fakes: Fakes) -> None:
    proc = fakes.run(MT_STATES="", EFS_WAIT_ATTEMPTS="2")
    assert proc.returncode == 3
    assert "has no mount targets yet" in proc.stdout


def test_mount_missing_after_mount_fails_the_bootstrap(fakes: Fakes) -> None:
    proc = fakes.run(MOUNT_NOOP="1")
    assert proc.returncode == 4
    assert f"{fakes.mount_point} is not in {fakes.proc_mounts}" in proc.stderr
    assert f"EFS {FS_ID} is NOT mounted" in proc.stderr
    assert fakes.calls("chown") == []


def test_failing_mount_reports_its_output(fakes: Fakes) -> None:
    proc = fakes.run(MOUNT_FAILS="1")
    assert proc.returncode == 4
    assert "access denied by server" in proc.stderr
    assert "mount -t nfs4" in proc.stderr


def test_already_mounted_is_left_alone(fakes: Fakes) -> None:
    fakes.mount_point.mkdir()
    fakes.proc_mounts.write_text(f"server:/ {fakes.mount_point} nfs4 rw 0 0\n")
    proc = fakes.run()
    assert proc.returncode == 0, proc.stderr
    assert "already mounted" in proc.stdout
    assert fakes.calls("mount") == [] and fakes.calls("aws") == []


@pytest.mark.parametrize(("args", "needle"), [
    (("fs-12",), "usage"),
    (("efs-0123456789abcdef0", REGION), "'efs-0123456789abcdef0' is not an EFS file system id"),
    ((FS_ID, "mars"), "'mars' is not an AWS region"),
    ((FS_ID, REGION, "relative/dir"), "mount point 'relative/dir' must be an absolute"),
])
def test_bad_arguments_name_the_bad_value(fakes: Fakes, args: tuple[str, ...],
                                          needle: str) -> None:
    proc = fakes.run(*args)
    assert proc.returncode == 2
    assert needle in proc.stderr
    assert fakes.calls("aws") == []
