"""The demo's check that a cluster user can run a job here (``dlc submit --as USER`` runs
the user's ranks with this checkout's Python): asked of the real unprivileged user
``nobody``, and when the answer is no, the directories that keep users out and the fix."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from emulator.demo import user_access
from emulator.node_inputs import PYTHON
from tests.conftest import REPO_ROOT
from tests.support.users import CAN_CREATE_USERS, reachable

pytestmark = pytest.mark.skipif(not CAN_CREATE_USERS, reason="running as nobody needs root")


def test_a_python_other_users_cannot_reach_is_named_with_the_fix():
    closed = Path(tempfile.mkdtemp(prefix="dl-closed-"))  # 0700, as /root often is
    try:
        (closed / "bin").mkdir(mode=0o755)
        (closed / "bin" / "python").symlink_to(os.path.realpath(PYTHON))
        with reachable(os.path.realpath(PYTHON), REPO_ROOT + "/x"):
            said = user_access.problem(str(closed / "bin" / "python"), Path(REPO_ROOT))
        assert "cluster users cannot run this project's Python" in said
        assert "Permission denied" in said
        assert f"chmod o+x {closed}" in said and "make setup" in said
    finally:
        shutil.rmtree(closed)


def test_a_python_every_user_reaches_says_nothing():
    with reachable(os.path.realpath(PYTHON), PYTHON, REPO_ROOT + "/x"):
        assert user_access.problem(PYTHON, Path(REPO_ROOT)) == ""
