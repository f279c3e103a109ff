"""The executor (root) prepares the shared EFS directories without following a link there."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from bootstrap_scripts.jobs.executor.daemon import EFS_DIR_MODES, prepare_shared_dirs


def test_a_link_in_place_of_a_shared_directory_is_left_alone(tmp_path: Path) -> None:
    efs, elsewhere = tmp_path / "efs", tmp_path / "elsewhere"
    efs.mkdir()
    elsewhere.mkdir(mode=0o700)
    name = next(iter(EFS_DIR_MODES))
    (efs / name).symlink_to(elsewhere)
    changed = prepare_shared_dirs(efs)
    assert efs / name not in changed
    assert stat.S_IMODE(os.stat(elsewhere).st_mode) == 0o700  # the target kept its mode
    for other, mode in EFS_DIR_MODES.items():  # the real ones got theirs
        if other != name:
            assert stat.S_IMODE((efs / other).stat().st_mode) == mode
