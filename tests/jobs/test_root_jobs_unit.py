"""Unit tests of ``root_jobs``: root's job files need the master's signature (fast; no KMS:
a signer and a verifier that agree on one secret stand in for the key)."""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path

import pytest

from bootstrap_scripts.jobs.engine import root_jobs
from bootstrap_scripts.protocol.membership_signature import ALGORITHM, Signature

KEY = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"


def sign(digest: bytes) -> Signature:
    return Signature(key=KEY, algorithm=ALGORITHM,
                     value=hmac.new(b"master", digest, hashlib.sha256).digest())


def verify(digest: bytes, sig: Signature) -> bool:
    return hmac.compare_digest(sig.value, sign(digest).value)


def spec(tmp_path: Path, text: str = '{"job_id": "j"}\n', signed: bool = True) -> Path:
    d = tmp_path / "jobs" / "root" / "j"
    d.mkdir(parents=True)
    path = d / "spec.json"
    root_jobs.sign_before(path, text, sign if signed else None)
    path.write_text(text)
    return path


def refusal(path: Path, uid: int = 0, check=verify) -> str:
    return root_jobs.refusal(path.parent, path.name, path.read_text(), uid, check)


def test_a_spec_the_master_signed_is_taken(tmp_path):
    path = spec(tmp_path)
    assert (path.parent / "spec.json.sig").is_file()
    assert refusal(path) == ""


def test_an_unsigned_root_spec_is_refused_naming_the_missing_signature(tmp_path):
    assert refusal(spec(tmp_path, signed=False)) == \
        "root's spec.json carries no master's signature (spec.json.sig)"


def test_a_spec_changed_after_signing_is_refused(tmp_path):
    path = spec(tmp_path)
    path.write_text('{"job_id": "j", "shares": "evil"}\n')
    assert refusal(path) == "root's spec.json: the signature is not the master's"


def test_another_keys_signature_or_a_garbled_one_is_refused(tmp_path):
    path = spec(tmp_path)
    assert "not the master's" in refusal(path, check=lambda d, s: False)
    (path.parent / "spec.json.sig").write_text("{not json")
    assert "malformed signature" in refusal(path)
    (path.parent / "spec.json.sig").write_text(
        '{"key": "k", "algorithm": "RSASSA_PSS_SHA_256", "value": ""}')
    assert "expected ECDSA_SHA_256" in refusal(path)


def test_a_signature_that_is_a_link_is_not_read(tmp_path):
    path = spec(tmp_path)
    sig = path.parent / "spec.json.sig"
    real = tmp_path / "elsewhere.sig"
    sig.rename(real)
    sig.symlink_to(real)
    assert "cannot be read safely" in refusal(path)


def test_users_files_and_keyless_nodes_are_not_checked(tmp_path):
    path = spec(tmp_path, signed=False)
    assert refusal(path, uid=1001) == ""  # a user's job runs as that user
    assert refusal(path, check=None) == ""  # no key installed: nothing is signed


def test_the_signature_is_written_before_the_file_and_a_failed_signing_names_the_way(tmp_path):
    def denied(digest: bytes) -> Signature:
        raise RuntimeError("AccessDeniedException: kms:Sign")

    path = tmp_path / "spec.json"
    with pytest.raises(root_jobs.RootJobError, match="submit root's jobs on the master"):
        root_jobs.sign_before(path, "{}", denied)
    assert not path.exists() and not (tmp_path / "spec.json.sig").exists()


def test_the_installed_key_is_read_only_from_roots_regular_file(tmp_path):
    assert root_jobs.installed_key(tmp_path) == ""
    f = tmp_path / root_jobs.KEY_FILE
    f.parent.mkdir(parents=True)
    f.write_text(root_jobs.render_key_file(KEY))
    assert root_jobs.installed_key(tmp_path) == KEY
    f.unlink()
    other = tmp_path / "planted"
    other.write_text(KEY + "\n")
    f.symlink_to(other)
    assert root_jobs.installed_key(tmp_path) == ""


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_a_key_file_of_another_owner_is_ignored(tmp_path):
    f = tmp_path / root_jobs.KEY_FILE
    f.parent.mkdir(parents=True)
    f.write_text(KEY + "\n")
    os.chown(f, 4242, 4242)
    assert root_jobs.installed_key(tmp_path) == ""


def test_only_root_signs(tmp_path, monkeypatch):
    f = tmp_path / root_jobs.KEY_FILE
    f.parent.mkdir(parents=True)
    f.write_text(KEY + "\n")
    monkeypatch.setattr(os, "geteuid", lambda: 1001)
    assert root_jobs.signer(tmp_path) is None
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert root_jobs.signer(tmp_path) is not None
    assert root_jobs.signer(tmp_path / "nokey") is None


def test_a_root_request_is_checked_over_the_very_bytes_that_are_parsed(tmp_path, monkeypatch):
    """The controller reads root's ``request.json`` once and checks the signature over what
    it parses (``managed.checked_request``): a forged request swapped in for one read and the
    signed one back for another cannot run. Here every read after the first returns the
    signed request, the first the forged one (the attacker's best timing)."""
    from bootstrap_scripts.jobs.engine import managed, userfiles
    from bootstrap_scripts.protocol.managed_records import ManagedRequest
    from bootstrap_scripts.protocol.paths import ClusterPaths
    from bootstrap_scripts.protocol.run_request import RunRequest

    paths = ClusterPaths(tmp_path).managed("j", "root")
    paths.dir.mkdir(parents=True)

    def request(command: str) -> str:
        return ManagedRequest(job_id="j", run=RunRequest(job_id="j", command=(command,)),
                              submitted_at=1.0, user="root").to_json()

    signed, forged = request("true"), request("evil")
    root_jobs.sign_before(paths.request, signed, sign)
    paths.request.write_text(signed)
    real, reads = userfiles.read_owned, []

    def swapping(directory, name, **kw):
        owned = real(directory, name, **kw)
        if name == paths.request.name:
            reads.append(name)
            if len(reads) == 1:
                return owned.__class__(**{**owned.__dict__, "text": forged})
        return owned

    monkeypatch.setattr(userfiles, "read_owned", swapping)
    got, problem = managed.checked_request(paths, verify)
    assert got is not None and got.run.command == ("evil",)
    assert problem == "root's request.json: the signature is not the master's"
    reads.clear()
    assert managed.queue(tmp_path, verify) == []  # the controller's queue: not taken
    monkeypatch.setattr(userfiles, "read_owned", real)  # the control: no swap, taken
    assert [p.key for p, _r in managed.queue(tmp_path, verify)] == [paths.key]
    got, problem = managed.checked_request(paths, verify)
    assert got is not None and got.run.command == ("true",) and problem == ""
