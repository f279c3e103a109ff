"""Image references: ``[registry/]repository[:tag][@sha256:digest]``, parsed strictly.

WHY strict: a reference reaches podman's argv and the stack's allow rule; what it names must
be exactly one repository, so anything outside the grammar of the distribution
specification (upper case in a path, empty components, a digest that is not sha256 hex) is
refused with the part that is wrong, never guessed at. The defaults are Docker's (no
registry: ``docker.io``; one component on Docker Hub: ``library/``), so the repository the
allow rule sees is the one podman pulls.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_REGISTRY = "docker.io"
#: The distribution specification's limits: a name's total length and a tag's.
MAX_NAME = 255
MAX_REFERENCE = 1024

_PATH_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_HOST_LABEL = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_REGISTRY = re.compile(rf"{_HOST_LABEL}(?:\.{_HOST_LABEL})*(?::[0-9]{{1,5}})?")
_TAG = re.compile(r"[\w][\w.-]{0,127}")
_DIGEST = re.compile(r"sha256:[a-f0-9]{64}")


class BadReference(ValueError):
    """A malformed image reference; the message quotes it and names the wrong part."""


@dataclass(frozen=True)
class ImageRef:
    """One parsed reference. ``repository`` includes the registry: ``nvcr.io/nvidia/pytorch``."""

    registry: str
    path: str
    tag: str | None = None
    digest: str | None = None

    @property
    def repository(self) -> str:
        return f"{self.registry}/{self.path}"

    @property
    def pinned(self) -> bool:
        return self.digest is not None

    def with_digest(self, digest: str) -> ImageRef:
        """The same image pinned to ``digest`` (the registry's answer at submit)."""
        if not _DIGEST.fullmatch(digest):
            raise BadReference(f"digest {digest!r} is not sha256:<64 hex digits>")
        return ImageRef(self.registry, self.path, self.tag, digest)

    def pinned_name(self) -> str:
        """``repository@digest``: what every node and every restart runs."""
        if self.digest is None:
            raise BadReference(f"image {self} is not pinned to a digest")
        return f"{self.repository}@{self.digest}"

    def __str__(self) -> str:
        text = self.repository
        if self.tag:
            text += f":{self.tag}"
        if self.digest:
            text += f"@{self.digest}"
        return text


def _split_registry(name: str) -> tuple[str, str]:
    first, sep, rest = name.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first, rest
    return DEFAULT_REGISTRY, name


def parse(text: str) -> ImageRef:
    """Parse ``text`` or raise :class:`BadReference` naming what is malformed."""
    if not isinstance(text, str) or not text:
        raise BadReference("an image reference is required (registry/repository:tag)")
    if len(text) > MAX_REFERENCE:
        raise BadReference(f"image reference longer than {MAX_REFERENCE} characters")
    if any(c.isspace() for c in text) or not text.isprintable():
        raise BadReference(f"image reference {text!r} contains spaces or control characters")
    name, at, digest = text.partition("@")
    if at and not _DIGEST.fullmatch(digest):
        raise BadReference(f"image {text!r}: digest {digest!r} is not sha256:<64 hex digits>")
    tag = None
    slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > slash:
        name, tag = name[:colon], name[colon + 1:]
        if not _TAG.fullmatch(tag):
            raise BadReference(f"image {text!r}: tag {tag!r} is malformed (letters, digits, "
                               f"'_', '.', '-', at most 128, not starting with '.' or '-')")
    registry, path = _split_registry(name)
    if not _REGISTRY.fullmatch(registry):
        raise BadReference(f"image {text!r}: registry {registry!r} is malformed")
    components = path.split("/")
    for component in components:
        if not _PATH_COMPONENT.fullmatch(component):
            raise BadReference(f"image {text!r}: repository component {component!r} is "
                               f"malformed (lower-case letters, digits, separators '.', '_', "
                               f"'__', '-' between them)")
    if registry == DEFAULT_REGISTRY and len(components) == 1:
        path = f"library/{path}"
    if len(f"{registry}/{path}") > MAX_NAME:
        raise BadReference(f"image {text!r}: repository name longer than {MAX_NAME} characters")
    return ImageRef(registry, path, tag, digest or None)
