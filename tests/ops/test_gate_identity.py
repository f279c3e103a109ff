"""The health gate's own system user (``jobs/engine/gate_identity.py``): made once, no login,
and used only where it can run the gate (a real user and real processes: needs root)."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

from bootstrap_scripts.jobs.engine import gate_identity
from tests.conftest import REPO_ROOT
from tests.support.users import reachable_python

__all__ = ["reachable_python"]


@pytest.fixture()
def gate_user():
    if os.geteuid() != 0:
        pytest.skip("making a system user needs root")
    gate_identity.ensure()
    return gate_identity.lookup()


def test_the_gate_user_is_a_system_user_without_a_login(gate_user):
    assert gate_identity.ensure().endswith("already there")  # idempotent
    assert gate_user.pw_uid < 1000 and gate_user.pw_uid != 0
    assert gate_user.pw_dir == gate_identity.HOME and not Path(gate_user.pw_dir).exists()
    assert gate_user.pw_shell.endswith(("nologin", "false"))


def test_the_gate_user_is_used_only_where_it_can_run_the_gate(gate_user, reachable_python,
                                                             tmp_path):
    assert "the node installer makes it" in gate_identity.usable(None, sys.executable,
                                                                 REPO_ROOT, tmp_path)
    private = tmp_path / "efs"
    private.mkdir(mode=0o700)
    assert "cannot run the gate" in gate_identity.usable(gate_user, sys.executable,
                                                         REPO_ROOT, private)
    shared = Path(tempfile.mkdtemp(prefix="dl-gate-efs-"))
    try:
        os.chmod(shared, 0o755)
        assert gate_identity.usable(gate_user, sys.executable, REPO_ROOT, shared) == ""
    finally:
        shared.rmdir()
