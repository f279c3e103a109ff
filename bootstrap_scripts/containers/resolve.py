"""A tag resolved to its digest once, at submit: every node and every restart runs those bits.

``dl-run --image REPOSITORY:TAG`` (and so ``dlc submit --image``) asks the registry, as the
submitting user, which manifest the tag names now, and the job's request carries
``REPOSITORY:TAG@sha256:…`` from then on: a tag moved after the submit (a new push of
``:latest``) changes nothing for the job, its restarts or a replacement node.

How: ``skopeo inspect --raw docker://REPOSITORY:TAG`` returns the manifest's bytes exactly
as the registry serves them (an image manifest, or a list of them per platform), and
their sha256 is the digest every puller checks (the distribution specification's content
address). skopeo speaks the registry protocol with the user's own credentials (what
``podman login`` or ``aws ecr get-login-password | podman login`` stored), ECR's included.
Its environment is fixed (``pull.podman_env``), so its error lines are the ones
:mod:`causes` reads. A tag the registry does not have is refused naming the tag and the
repository; every other failure names its cause.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Mapping

from bootstrap_scripts.containers import causes
from bootstrap_scripts.containers.pull import podman_env
from bootstrap_scripts.containers.reference import ImageRef

SKOPEO = "skopeo"
RESOLVE_TIMEOUT = 120
#: A manifest (or a list of them) is a few kilobytes; anything past this is not one.
MAX_MANIFEST_BYTES = 4 * 1024 * 1024
#: The tag of a reference without one (Docker's default).
DEFAULT_TAG = "latest"


class ResolveError(ValueError):
    """The tag could not be resolved; the message names the image, the tag and the cause."""

    def __init__(self, message: str, cause: str) -> None:
        super().__init__(message)
        self.cause = cause


def manifest_digest(raw: bytes) -> str:
    """The content address of a manifest's bytes (pure)."""
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def resolve(image: ImageRef, *, skopeo: str = SKOPEO,
            environ: Mapping[str, str] | None = None) -> ImageRef:
    """``image`` pinned to the digest its tag names now (unchanged when already pinned)."""
    if image.pinned:
        return image
    tag = image.tag or DEFAULT_TAG
    name = f"{image.repository}:{tag}"
    try:
        done = subprocess.run([skopeo, "inspect", "--raw", f"docker://{name}"],
                              capture_output=True, check=False, timeout=RESOLVE_TIMEOUT,
                              env=podman_env(os.environ if environ is None else environ))
    except FileNotFoundError:
        raise ResolveError(f"cannot resolve image {name} to a digest: {skopeo} is not "
                           f"installed on this node", causes.OTHER) from None
    except subprocess.TimeoutExpired:
        raise ResolveError(f"cannot resolve image {name} to a digest: the registry did not "
                           f"answer within {RESOLVE_TIMEOUT} s", causes.UNREACHABLE) from None
    if done.returncode != 0:
        text = done.stderr.decode(errors="replace")
        cause = causes.cause_of(text)
        why = causes.last_error(text) or f"{skopeo} exited {done.returncode}"
        if cause == causes.NOT_FOUND:
            raise ResolveError(f"image {name}: tag {tag!r} not found in {image.repository} "
                               f"({why})", cause)
        raise ResolveError(f"cannot resolve image {name} to a digest: {cause}: {why}", cause)
    raw = done.stdout
    if not raw.strip() or len(raw) > MAX_MANIFEST_BYTES or not raw.lstrip().startswith(b"{"):
        raise ResolveError(f"cannot resolve image {name} to a digest: the registry's answer "
                           f"is not a manifest", causes.OTHER)
    return ImageRef(image.registry, image.path, tag, manifest_digest(raw))
