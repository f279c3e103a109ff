"""A full local disk leaves no ``*.status.tmp.*`` behind (``share_wrapper.write_status``):
a real ENOSPC from a tiny tmpfs (root mounts it for the test)."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess

import pytest

from bootstrap_scripts.jobs.executor.share_wrapper import write_status

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")


@pytest.fixture()
def full_disk(tmp_path):
    mnt = tmp_path / "disk"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "faults-disk", str(mnt)],
                   check=True, timeout=30)
    try:
        fd = os.open(mnt / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0" * 4096)
        os.close(fd)
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False, timeout=30)


def test_a_status_that_cannot_be_written_leaves_no_temporary_file(full_disk):
    path = full_disk / "job.0.0.status"
    with pytest.raises(OSError) as raised:
        write_status(str(path), 3, 1234)
    assert raised.value.errno == errno.ENOSPC
    assert sorted(p.name for p in full_disk.iterdir()) == ["filler"]
