"""Drills: another user plants a checkpoint for the victim's job to resume from (F2).

A checkpoint the example job resumes from is unpickled: before, anyone could create the
directory the victim's job would use (``checkpoints/`` was mode 1777) and put a
``latest.json`` and a pickle there whose loading ran the attacker's code as the victim.
Now each user's checkpoints live in ``checkpoints/<user>/`` (made by root, 0700, the
user's), and the example loads only its own files, weights only.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from bootstrap_scripts.examples import train_digits
from emulator.nodes import PYTHON, base_env
from tests.conftest import REPO_ROOT
from tests.security.conftest import as_user, dl

pytestmark = [pytest.mark.slow]

#: the attacker's side: plant a checkpoint and its pointer wherever the victim's job may
#: look, reporting for each directory whether it could
PLANT = """
import errno, os, shutil, sys
payload = sys.argv[1]
for d in sys.argv[2:]:
    try:
        os.makedirs(d, exist_ok=True)
        shutil.copyfile(payload, os.path.join(d, "epoch-0001.pt"))
        with open(os.path.join(d, "latest.json"), "w") as fh:
            fh.write('{"epoch": 1, "step": 0, "global_step": 0, "file": "epoch-0001.pt"}')
        os.chmod(d, 0o777)
        print("planted", d)
    except OSError as exc:
        print("refused", d, errno.errorcode[exc.errno])
"""


def write_payload(path: Path, marker_dir: Path) -> None:
    """A torch checkpoint whose unpickling runs a shell command (leaves ``pwned-<uid>``)."""
    import torch

    class Payload:
        def __reduce__(self):
            return os.system, (f"touch {marker_dir}/pwned-$(id -u)",)

    torch.save({"model": Payload(), "epoch": 1, "step": 0}, path)
    os.chmod(path, 0o644)


def test_no_user_can_plant_a_checkpoint_for_another_users_job(cluster, victim, attacker,
                                                               shared_tmp):
    c = cluster
    payload = shared_tmp / "payload.pt"
    write_payload(payload, shared_tmp)
    checkpoints = c.efs / "checkpoints"
    # where the victim's `train_digits` looks by default: its own directory (and, before,
    # the shared one)
    targets = [checkpoints / victim.pw_name / "digits", checkpoints / "digits"]
    planted = as_user(attacker, PLANT, str(payload), *map(str, targets))
    assert planted.returncode == 0, planted.stderr
    assert planted.stdout.split("\n")[:2] == [f"refused {t} EACCES" for t in targets], \
        planted.stdout

    rc, out = dl(c, victim, "dl-run", "--unmanaged", "--launcher", "each", "--",
                 "python", "-m", "bootstrap_scripts.examples.train_digits", "--resume",
                 "--epochs", "1")
    assert sorted(p.name for p in shared_tmp.glob("pwned-*")) == [], out
    assert rc == 0, out
    mine = checkpoints / victim.pw_name
    st = mine.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (victim.pw_uid, 0o700)
    st = checkpoints.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o755)
    saved = sorted((mine / "digits").iterdir())
    assert {"epoch-0001.pt", "latest.json"} <= {p.name for p in saved}, saved
    for p in saved:  # the job's checkpoints: its owner's alone
        st = p.stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode) & 0o077) == (victim.pw_uid, 0), p


def test_the_example_never_runs_code_from_a_checkpoint(tmp_path):
    """Even a payload in the user's own directory (copied there by mistake) is refused:
    the example loads weights only."""
    ckdir = tmp_path / "ck"
    ckdir.mkdir()
    write_payload(ckdir / "epoch-0001.pt", tmp_path)
    (ckdir / "latest.json").write_text(json.dumps(
        {"epoch": 1, "step": 0, "global_step": 0, "file": "epoch-0001.pt"}))
    out = subprocess.run([PYTHON, "-m", "bootstrap_scripts.examples.train_digits", "--resume",
                          "--epochs", "1", "--checkpoint-dir", str(ckdir)], cwd=REPO_ROOT,
                         env=base_env(), capture_output=True, text=True, timeout=120)
    assert sorted(p.name for p in tmp_path.glob("pwned-*")) == [], out.stdout + out.stderr
    assert out.returncode != 0 and "weights_only" in out.stderr, out.stdout + out.stderr


def test_the_example_ignores_a_pointer_out_of_its_directory_or_not_its_own(tmp_path):
    ckdir = tmp_path / "ck"
    ckdir.mkdir()
    (tmp_path / "elsewhere.pt").write_bytes(b"x")
    (ckdir / "epoch-0001.pt").write_bytes(b"x")
    latest = ckdir / "latest.json"
    for pointer in ("../elsewhere.pt", str(tmp_path / "elsewhere.pt"), "latest.json"):
        latest.write_text(json.dumps({"epoch": 1, "step": 0, "file": pointer}))
        assert train_digits.latest_info(ckdir) is None, pointer
    latest.write_text(json.dumps({"epoch": 1, "step": 0, "file": "epoch-0001.pt"}))
    assert train_digits.latest_info(ckdir)["path"] == ckdir / "epoch-0001.pt"
    (ckdir / "epoch-0002.pt").symlink_to(tmp_path / "elsewhere.pt")
    latest.write_text(json.dumps({"epoch": 2, "step": 0, "file": "epoch-0002.pt"}))
    assert train_digits.latest_info(ckdir) is None  # a link, even to a file of ours
    if os.geteuid() == 0:  # another user's pointer (only root can give a file away)
        latest.write_text(json.dumps({"epoch": 1, "step": 0, "file": "epoch-0001.pt"}))
        os.chown(latest, 65534, 65534)
        assert train_digits.latest_info(ckdir) is None
