"""``make setup`` installs this checkout into its venv, so ``.venv/bin/dlc`` is a command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

VENV = Path(REPO_ROOT) / ".venv"


@pytest.mark.skipif(Path(sys.prefix).resolve() != VENV.resolve(),
                    reason="runs in the checkout's own .venv (the one `make setup` makes)")
def test_make_setup_puts_dlc_on_the_venvs_path():
    dlc = VENV / "bin" / "dlc"
    assert dlc.exists(), "make setup did not install the project: no .venv/bin/dlc"
    res = subprocess.run([str(dlc), "--help"], capture_output=True, text=True, timeout=60,
                         cwd="/")  # from anywhere, not only the checkout
    assert res.returncode == 0, res.stderr
    assert "submit" in res.stdout and "status" in res.stdout
