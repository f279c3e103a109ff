"""A spec swapped for root's after the scanner read it is not started (``Shares.start``).

On a node with the membership key, the scanner reads each spec once and lets a spec of
root's through only with the master's signature (``root_jobs``), remembering the job in
``Shares.root_specs``. Between that read and the start, root on another node could replace
a user's spec with one of root's: :meth:`Shares.start` takes the owner again from what it
opens, and a spec that is root's now but was not signed when read is refused, nothing
started. In-process executor over real files (the test runs as root, as CI does)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from bootstrap_scripts.jobs.executor.daemon import Executor, prepare_shared_dirs
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.jobs import JobSpec, Proc, Share

ADDRESS = "127.20.251.2"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="root's specs: the executor is root")


@pytest.fixture()
def executor(tmp_path: Path):
    ex = Executor(tmp_path / "node", tmp_path / "efs", ADDRESS)
    ex.efs.mkdir(parents=True, exist_ok=True)
    prepare_shared_dirs(ex.efs)  # as at the executor's start: jobs/, checkpoints/ made
    yield ex
    ex.shares.stop_all("test over")


def root_job(ex: Executor, job_id: str):
    paths = ex.node.cluster.job(job_id)
    paths.dir.mkdir(parents=True)
    share = Share(0, ADDRESS, (Proc(argv=(sys.executable, "-c", "import time; time.sleep(600)")),))
    spec = JobSpec(job_id=job_id, launcher="each", shares=(share,))
    store.atomic_write(paths.spec, spec.to_json())  # root's: the test is root
    return spec, share, paths


def test_a_root_spec_the_scanner_did_not_see_signed_is_not_started(executor: Executor) -> None:
    spec, share, paths = root_job(executor, "swapped")
    executor.shares.root_specs = set()  # a keyed node: nothing of root's was signed
    assert executor.shares.start(spec, share, paths) is False
    assert paths.key not in executor.shares.running
    assert not paths.nodes.exists()  # nothing made in its directory either


def test_the_same_root_spec_seen_signed_starts(executor: Executor) -> None:
    """The control: the same spec, remembered as signed when read, starts."""
    spec, share, paths = root_job(executor, "signed")
    executor.shares.root_specs = {paths.key}
    assert executor.shares.start(spec, share, paths) is True
    assert paths.key in executor.shares.running


def test_a_node_without_the_key_checks_nothing(executor: Executor) -> None:
    """No key installed (``root_specs`` None): root's jobs run as before the signatures."""
    spec, share, paths = root_job(executor, "unkeyed")
    assert executor.shares.root_specs is None
    assert executor.shares.start(spec, share, paths) is True
