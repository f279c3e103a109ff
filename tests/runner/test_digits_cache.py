"""The example's data split cached in the checkpoint directory (``digits_data``): a restart
reads it with numpy alone, gets the very arrays the first start computed, and never trusts a
file it did not write (a link, another user's file, a pickled object, a broken file)."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bootstrap_scripts.examples import digits_data as dd

ROOT = Path(__file__).resolve().parents[2]


def cached(tmp_path: Path) -> list[Path]:
    return sorted(tmp_path.glob("digits-split-*.npz"))


def same(a, b) -> bool:
    return len(a) == len(b) == 4 and all(np.array_equal(x, y) and x.dtype == y.dtype
                                         for x, y in zip(a, b, strict=True))


def test_the_first_start_caches_the_split_a_restart_reads_it_without_scikit_learn(tmp_path):
    first = dd.load_data(0, 0.2, cache_dir=tmp_path)
    assert same(first, dd.compute_split(0, 0.2))
    (path,) = cached(tmp_path)
    assert not list(tmp_path.glob("*.tmp"))  # written by temp file + rename
    probe = ("import sys; from pathlib import Path\n"
             "from bootstrap_scripts.examples.digits_data import load_data\n"
             f"x = load_data(0, 0.2, cache_dir=Path({str(tmp_path)!r}))\n"
             "print(sorted(m for m in sys.modules if m.split('.')[0] == 'sklearn'), "
             "[len(a) for a in x])")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120, check=True, cwd=ROOT)
    assert done.stdout.strip() == f"[] {[len(a) for a in first]}"
    assert done.stderr == ""
    assert same(dd.read_split(tmp_path, path.name), first)


def test_another_seed_fraction_or_source_is_another_cache_file_replacing_the_last(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    x = np.arange(200 * 64, dtype=np.float64).reshape(200, 64) % 17
    np.savez(data / "digits.npz", x=x, y=np.arange(200) % 10)
    raw = (data / "digits.npz").read_bytes()
    splits, names = [], []
    for seed, fraction, data_dir, source in ((0, 0.2, "", b""), (1, 0.2, "", b""),
                                             (0, 0.25, "", b""), (0, 0.2, str(data), raw)):
        splits.append(dd.load_data(seed, fraction, data_dir, cache_dir=tmp_path))
        names.append(dd.cache_name(seed, fraction, source))
        assert [p.name for p in cached(tmp_path)] == [names[-1]]  # the other one pruned
    a, b, c, d = splits
    assert len(set(names)) == 4
    assert not np.array_equal(a[0], b[0]) and len(a[1]) != len(c[1])
    assert len(d[0]) + len(d[1]) == 200
    assert same(dd.load_data(0, 0.2, str(data), cache_dir=tmp_path), d)
    assert same(dd.load_data(1, 0.2, cache_dir=tmp_path), b)


def test_pruning_removes_only_the_users_own_regular_split_files(tmp_path):
    """Older splits of the user's go; a link (and what it names), a directory, another
    user's file and other names stay."""
    elsewhere = tmp_path.parent / f"{tmp_path.name}-target"
    elsewhere.write_bytes(b"not the user's cache")
    ck = tmp_path / "ck"
    ck.mkdir()
    old = ck / f"digits-split-{'a' * 16}.npz"
    old.write_bytes(b"an older split")
    link = ck / f"digits-split-{'b' * 16}.npz"
    link.symlink_to(elsewhere)
    a_dir = ck / f"digits-split-{'c' * 16}.npz"
    a_dir.mkdir()
    others = [ck / "digits-split-notahash.npz", ck / "epoch-0001.pt",
              ck / f"digits-split-{'d' * 16}.npz.tmp"]
    for path in others:
        path.write_bytes(b"x")
    theirs = ck / f"digits-split-{'e' * 16}.npz"
    theirs.write_bytes(b"another user's")
    if os.geteuid() == 0:
        os.chown(theirs, pwd.getpwnam("nobody").pw_uid, -1)
    dd.load_data(0, 0.2, cache_dir=ck)
    assert not old.exists()
    assert link.is_symlink() and elsewhere.read_bytes() == b"not the user's cache"
    assert a_dir.is_dir() and all(p.exists() for p in others)
    assert theirs.exists() == (os.geteuid() == 0)  # as root it is nobody's: kept
    assert (ck / dd.cache_name(0, 0.2, b"")).is_file()


def plant(tmp_path: Path, write) -> Path:
    """A file where the split's cache goes, written by ``write(path)``."""
    path = tmp_path / dd.cache_name(0, 0.2, b"")
    write(path)
    return path


def test_a_link_is_never_read_through_and_is_replaced(tmp_path, capsys):
    target = tmp_path / "elsewhere.npz"
    with open(target, "wb") as fh:
        np.savez(fh, **dict(zip(dd.SPLIT_KEYS, (np.zeros((2, 64), np.float32),) * 2
                                + (np.zeros(2, np.int64),) * 2, strict=True)))
    before = target.read_bytes()
    path = plant(tmp_path, lambda p: p.symlink_to(target))
    split = dd.load_data(0, 0.2, cache_dir=tmp_path)
    assert len(split[0]) > 1000  # the real digits, not the link's two zeros
    assert "ignoring the cached digits" in capsys.readouterr().err
    assert not path.is_symlink() and target.read_bytes() == before
    assert same(dd.read_split(tmp_path, path.name), split)


def test_another_user_s_file_is_ignored(tmp_path, capsys):
    if os.geteuid() != 0:
        pytest.skip("chown needs root")
    dd.load_data(0, 0.2, cache_dir=tmp_path)
    (path,) = cached(tmp_path)
    os.chown(path, pwd.getpwnam("nobody").pw_uid, -1)
    assert dd.read_split(tmp_path, path.name) is None
    assert "is not a file of uid" in capsys.readouterr().err


def test_a_pickled_object_is_refused_not_run(tmp_path, capsys):
    marker = tmp_path / "ran"
    evil = np.array([Runs(str(marker))] * 4, dtype=object)
    plant(tmp_path, lambda p: p.write_bytes(npz_bytes(tmp_path, x_train=evil, x_test=evil,
                                                      y_train=evil, y_test=evil)))
    split = dd.load_data(0, 0.2, cache_dir=tmp_path)
    assert not marker.exists()
    assert len(split[2]) > 1000
    assert "ignoring the cached digits" in capsys.readouterr().err


@pytest.mark.parametrize("content", [b"", b"not a zip at all", b"PK\x03\x04broken"])
def test_a_broken_cache_is_ignored_and_rewritten(tmp_path, capsys, content):
    path = plant(tmp_path, lambda p: p.write_bytes(content))
    split = dd.load_data(0, 0.2, cache_dir=tmp_path)
    assert "ignoring the cached digits" in capsys.readouterr().err
    assert same(dd.read_split(tmp_path, path.name), split)


def test_arrays_of_the_wrong_shape_or_type_are_ignored(tmp_path, capsys):
    good = dd.compute_split(0, 0.2)
    for bad in ({**dict(zip(dd.SPLIT_KEYS, good, strict=True)), "x_train": good[0][:, :8]},
                {**dict(zip(dd.SPLIT_KEYS, good, strict=True)), "y_test": good[3][:-1]},
                {**dict(zip(dd.SPLIT_KEYS, good, strict=True)),
                 "x_test": good[1].astype(np.float64)},
                {k: v for k, v in zip(dd.SPLIT_KEYS, good, strict=True) if k != "y_train"}):
        path = plant(tmp_path, lambda p, bad=bad: p.write_bytes(npz_bytes(tmp_path, **bad)))
        assert dd.read_split(tmp_path, path.name) is None
    assert capsys.readouterr().err.count("ignoring the cached digits") == 4


def test_a_directory_that_cannot_be_written_costs_only_the_cache(tmp_path, capsys):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    split = dd.load_data(0, 0.2, cache_dir=not_a_dir / "ck")
    assert same(split, dd.compute_split(0, 0.2))
    assert "not caching the digits" in capsys.readouterr().err


class Runs:
    """Pickles to a call that creates ``marker``: what a hostile cache file could hold."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def npz_bytes(tmp_path: Path, **arrays) -> bytes:
    path = tmp_path / "made.npz"
    np.savez(path, **arrays)
    data = path.read_bytes()
    path.unlink()
    return data
