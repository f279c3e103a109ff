"""The checkpoint decision table: complete means manifest-last, the newest complete wins,
a checkpoint without its manifest is ignored and reported."""

from __future__ import annotations

import re

import pytest

from bootstrap_scripts.data import checkpoint_plan as cp


def manifest(name: str, step: int, size: int = 10, at: float = 1.0) -> cp.Manifest:
    return cp.new_manifest(name, step, at, [(f"{name}.pt", size)], {"step": step})


def place(*ms: cp.Manifest, extra: dict[str, int] | None = None,
          drop: str = "") -> cp.Survey:
    manifests = {m.manifest_file: m.render() for m in ms}
    sizes = {p: s for m in ms for p, s in m.files if p != drop}
    return cp.survey(manifests, {**sizes, **(extra or {})})


def test_a_checkpoint_whose_manifest_is_missing_is_ignored_and_reported() -> None:
    s = place(manifest("step-000010", 10), extra={"step-000020.pt": 10})
    assert [m.name for m in s.complete] == ["step-000010"]
    assert s.ignored == (("step-000020.pt",
                          "no manifest lists it (an unfinished or pruned checkpoint)"),)


def test_a_manifest_whose_files_are_missing_or_short_is_not_complete() -> None:
    a, b = manifest("step-000010", 10), manifest("step-000020", 20, size=10)
    s = place(a, b, drop="step-000020.pt")
    assert s.newest == a
    assert "missing" in dict(s.ignored)["step-000020.manifest.json"]
    s = cp.survey({b.manifest_file: b.render()}, {"step-000020.pt": 9})
    assert s.complete == () and "9 bytes, not 10" in dict(s.ignored)[b.manifest_file]


def test_a_malformed_or_foreign_manifest_is_ignored_with_its_name() -> None:
    m = manifest("step-000010", 10)
    s = cp.survey({"step-000010.manifest.json": "{", "other.manifest.json": m.render()},
                  {"step-000010.pt": 10})
    assert s.complete == ()
    why = dict(s.ignored)
    assert "malformed" in why["step-000010.manifest.json"]
    assert "not its own" in why["other.manifest.json"]


def test_the_newest_complete_checkpoint_wins_wherever_it_is() -> None:
    efs = place(manifest("step-000010", 10), manifest("step-000030", 30))
    s3 = place(manifest("step-000040", 40))
    choice = cp.choose_resume(efs, "/efs/ck", [("s3://b/p/", s3)])
    assert (choice.manifest.name, choice.where, choice.source, choice.fetch) == \
        ("step-000040", cp.S3, "s3://b/p/", True)
    older = place(manifest("step-000020", 20))
    choice = cp.choose_resume(efs, "/efs/ck", [("s3://b/p/", older)])
    assert (choice.manifest.name, choice.fetch) == ("step-000030", False)


def test_a_tie_stays_on_efs_and_an_empty_efs_takes_s3() -> None:
    m = manifest("step-000010", 10)
    assert cp.choose_resume(place(m), "/efs", [("s3://b/p/", place(m))]).where == cp.EFS
    choice = cp.choose_resume(cp.Survey(), "/efs", [("s3://b/p/", place(m))])
    assert choice.where == cp.S3 and choice.manifest == m
    assert cp.choose_resume(cp.Survey(), "/efs", []).manifest is None


def test_the_mirror_uploads_data_first_and_the_manifest_last_only_what_s3_lacks() -> None:
    a, b = manifest("step-000010", 10), manifest("step-000020", 20)
    assert cp.upload_order(b) == ["step-000020.pt", "step-000020.manifest.json"]
    todo = cp.uploads(place(b, a), {a.manifest_file: a.render()})
    assert todo == [b]
    assert cp.uploads(place(a, b), {}) == [a, b]  # oldest first


@pytest.mark.parametrize("url", ["s3://B/p", "https://b/p", "s3://bb/../x", "s3://bb/a//b",
                                 "s3://b", "bucket/prefix", ""])
def test_a_bad_url_is_refused_naming_it(url: str) -> None:
    with pytest.raises(cp.CheckpointError, match=re.escape(repr(url))):
        cp.parse_s3_url(url)


def test_urls_and_names_are_normalized_or_refused() -> None:
    assert cp.parse_s3_url("s3://my-bucket/a/b") == ("my-bucket", "a/b/")
    assert cp.parse_s3_url("s3://my-bucket") == ("my-bucket", "")
    assert cp.join_url("s3://my-bucket/checkpoints/c1/", "alice", "job-1") == \
        "s3://my-bucket/checkpoints/c1/alice/job-1/"
    for bad in ("../x", "a/../b", "/abs", ""):
        with pytest.raises(cp.CheckpointError, match="not a path inside"):
            cp.new_manifest("n", 1, 1.0, [(bad, 1)])
    with pytest.raises(cp.CheckpointError, match=re.escape("checkpoint name '../n'")):
        cp.new_manifest("../n", 1, 1.0, [("a", 1)])
