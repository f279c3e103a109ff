"""The pull's pure parts: a failure's cause and exit status, podman's fixed environment, its
progress lines, a manifest's digest (no podman, no registry)."""

from __future__ import annotations

import hashlib
import os
import pwd

import pytest

from bootstrap_scripts.containers import causes, pull, resolve
from bootstrap_scripts.containers.reference import parse

#: podman 4.3's and skopeo 1.9's own last lines (the first two seen here against the
#: emulated registry; the others as Docker Hub, ECR and containers/image word them).
LINES = [
    ("Error: initializing source docker://127.0.0.1:41117/team/absent:v1: reading manifest "
     "v1 in 127.0.0.1:41117/team/absent: manifest unknown: manifest unknown", causes.NOT_FOUND),
    ('Error: initializing source docker://127.0.0.1:1/team/absent:v1: pinging container '
     'registry 127.0.0.1:1: Get "https://127.0.0.1:1/v2/": dial tcp 127.0.0.1:1: connect: '
     "connection refused", causes.UNREACHABLE),
    ("Error: initializing source docker://docker.io/team/private:v1: reading manifest v1 in "
     "docker.io/team/private: requested access to the resource is denied",
     causes.ACCESS_DENIED),
    ("Error: initializing source docker://1234.dkr.ecr.us-east-1.amazonaws.com/t/x:v1: "
     "reading manifest v1: unauthorized: authentication required", causes.ACCESS_DENIED),
    ("Error: writing blob: storing blob to file \"/var/tmp/storage123/1\": write "
     "/var/tmp/storage123/1: no space left on device", causes.DISK_FULL),
    ("Error: reading manifest v1 in docker.io/library/ubuntu: toomanyrequests: You have "
     "reached your pull rate limit.", causes.THROTTLED),
    ('time="2026-01-01T00:00:00Z" level=fatal msg="Error parsing image name '
     '\\"docker://r/x:v1\\": pinging container registry r: Get \\"https://r/v2/\\": dial tcp: '
     'lookup r: no such host"', causes.UNREACHABLE),
    ("Error: something nobody foresaw", causes.OTHER),
]


@pytest.mark.parametrize(("line", "cause"), LINES)
def test_each_failure_is_named_by_its_cause(line, cause):
    assert causes.cause_of(line) == cause
    assert causes.last_error(f"Trying to pull x...\n{line}\n\n") == line[:300]


def test_each_cause_has_its_own_exit_status_and_back():
    assert len(set(causes.EXIT_OF.values())) == len(causes.EXIT_OF)
    assert all(causes.CAUSE_OF_EXIT[code] == cause for cause, code in causes.EXIT_OF.items())
    assert pull.EXIT_PULL_FAILED == causes.EXIT_OF[causes.OTHER] == 3
    assert 0 not in causes.CAUSE_OF_EXIT and 2 not in causes.CAUSE_OF_EXIT  # ok; refused


def test_podman_gets_a_fixed_environment_not_the_callers():
    me = pwd.getpwuid(os.getuid())
    given = {"PATH": "/node/bin:/usr/bin", "LD_PRELOAD": "/tmp/evil.so", "HOME": "/tmp/x",
             "CONTAINERS_CONF": "/tmp/mine.conf", "REGISTRY_AUTH_FILE": "/tmp/a.json",
             "LANG": "de_DE.UTF-8", "XDG_RUNTIME_DIR": "/nonexistent-runtime"}
    env = pull.podman_env(given)
    assert env == {"PATH": "/node/bin:/usr/bin", "HOME": me.pw_dir, "USER": me.pw_name,
                   "LOGNAME": me.pw_name, "LC_ALL": "C"}
    assert pull.podman_env({})["PATH"] == "/usr/local/bin:/usr/bin:/bin"


def test_a_runtime_directory_is_kept_only_when_it_is_the_users(tmp_path):
    mine = pull.podman_env({"XDG_RUNTIME_DIR": str(tmp_path)}, uid=os.stat(tmp_path).st_uid)
    assert mine["XDG_RUNTIME_DIR"] == str(tmp_path)
    other = pull.podman_env({"XDG_RUNTIME_DIR": str(tmp_path)},
                            uid=os.stat(tmp_path).st_uid + 1)
    assert "XDG_RUNTIME_DIR" not in other


def test_progress_counts_layers_and_drops_the_rest():
    seen, layers = [], 0
    for line in ("Trying to pull r/x@sha256:ab...", "Getting image source signatures",
                 "Copying blob sha256:3535a0f71454fc404822159865998cf741920c513db3",
                 "Copying blob sha256:9f00aa", "Copying config sha256:c6c6978aa515f7e6",
                 "Writing manifest to image destination", "Storing signatures"):
        shown, layers = pull.progress_line(line, layers)
        seen += [shown] if shown else []
    assert layers == 2
    assert seen == ["dl-container: layer 1: sha256:3535a0f71454", "dl-container: layer 2: "
                    "sha256:9f00aa", "dl-container: image configuration",
                    "dl-container: writing the manifest"]
    assert [pull.size_text(n) for n in (12, 3_100, 3_200_000, 1_500_000_000)] == [
        "12 B", "3.1 kB", "3.2 MB", "1.5 GB"]


def test_a_manifests_digest_is_the_sha256_of_its_bytes():
    raw = b'{"schemaVersion":2}'
    assert resolve.manifest_digest(raw) == "sha256:" + hashlib.sha256(raw).hexdigest()


def test_a_pinned_image_is_not_resolved_again():
    pinned = parse("r.example/team/x:v1@sha256:" + "ab" * 32)
    assert resolve.resolve(pinned, skopeo="/nonexistent/skopeo") is pinned


def test_without_skopeo_the_resolution_says_so():
    with pytest.raises(resolve.ResolveError, match="not installed") as caught:
        resolve.resolve(parse("r.example/team/x:v1"), skopeo="/nonexistent/skopeo")
    assert "r.example/team/x:v1" in str(caught.value)
