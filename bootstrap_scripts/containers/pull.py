"""``dl-container pull IMAGE@DIGEST``: the image in the calling user's store before any rank.

Ranks run with ``--pull=never`` (``podman_argv``), so the image must be on the node first:
this is that step, run as the job's user (its rootless store is the one its ranks read). By
digest only, so what is pulled is what was pinned at submit; podman checks the manifest
against the digest. An image already in the store is not fetched again (exit 0, "present").

A failure exits :data:`EXIT_PULL_FAILED` with podman's reason on stderr, so the caller can
fail the job as infrastructure before any rank starts, never as the user's code.
"""

from __future__ import annotations

import subprocess
import sys

from bootstrap_scripts.containers import podman_argv
from bootstrap_scripts.containers.reference import ImageRef

EXIT_PULL_FAILED = 3
PULL_TIMEOUT = 3600


def pull(image: ImageRef, *, podman: str = podman_argv.PODMAN) -> int:
    """Pull ``image`` (pinned) unless present; returns the exit status for ``dl-container``."""
    if not image.pinned:
        raise ValueError(f"image {image} is not pinned to a digest")
    ref = image.pinned_name()
    if subprocess.run([podman, "image", "exists", ref], check=False,
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0:
        print(f"dl-container: {ref} present", flush=True)
        return 0
    done = subprocess.run([podman, "pull", "--quiet", ref], check=False, text=True,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          timeout=PULL_TIMEOUT)
    if done.returncode != 0:
        reason = done.stderr.strip().splitlines()[-1:] or [f"podman exited {done.returncode}"]
        print(f"dl-container: pulling {ref} failed: {reason[0]}", file=sys.stderr)
        return EXIT_PULL_FAILED
    print(f"dl-container: {ref} pulled", flush=True)
    return 0
