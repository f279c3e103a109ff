"""The stack's allow rule: which repositories a cluster may run images from.

WHY: an image is code the job runs and bytes root's puller fetches; the administrator names
the registries and repositories they trust in the ``allowedImages`` setting, and everything
else is refused at submit, naming the repository and the setting. An entry is a repository
(``nvcr.io/nvidia/pytorch``) or a prefix on a path-component boundary (``nvcr.io/nvidia``
allows ``nvcr.io/nvidia/pytorch`` but not ``nvcr.io/nvidiaevil/x``; a registry alone allows
all of it). The list is empty by default: images are refused until the stack names some.
"""

from __future__ import annotations

from collections.abc import Iterable

from bootstrap_scripts.containers.reference import ImageRef

SETTING = "allowedImages"


class ImageNotAllowed(ValueError):
    """The image's repository is outside the stack's list; the message names both."""


def parse_entries(text: str) -> tuple[str, ...]:
    """The setting's comma-separated entries, trimmed, trailing ``/`` dropped, empties gone."""
    entries = (part.strip().rstrip("/") for part in text.split(","))
    return tuple(entry for entry in entries if entry)


def allows(entries: Iterable[str], repository: str) -> bool:
    """True when ``repository`` is one of ``entries`` or lies under one of them."""
    return any(repository == entry or repository.startswith(entry + "/") for entry in entries)


def check(entries: Iterable[str], image: ImageRef) -> None:
    """Raise :class:`ImageNotAllowed` unless the stack allows ``image``'s repository."""
    listed = tuple(entries)
    if allows(listed, image.repository):
        return
    if not listed:
        raise ImageNotAllowed(f"image repository {image.repository!r} refused: the stack's "
                              f"{SETTING} setting is empty, so this cluster runs no images")
    raise ImageNotAllowed(f"image repository {image.repository!r} refused: not under any "
                          f"entry of the stack's {SETTING} setting ({', '.join(listed)})")
