"""The stack's allow rule: which repositories a cluster may run images from.

WHY: an image is code the job runs and bytes root's puller fetches; the administrator names
the registries and repositories they trust in the ``allowedImages`` setting, and everything
else is refused at submit, naming the repository and the setting. An entry is a repository
(``nvcr.io/nvidia/pytorch``) or a prefix on a path-component boundary (``nvcr.io/nvidia``
allows ``nvcr.io/nvidia/pytorch`` but not ``nvcr.io/nvidiaevil/x``; a registry alone allows
all of it). The list is empty by default: images are refused until the stack names some.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from bootstrap_scripts.containers.reference import ImageRef
from bootstrap_scripts.node.node_region import read_installed_file

SETTING = "allowedImages"
#: Where the node installer writes the stack's list (one entry a line) for ``dl-run``.
SETTING_FILE = "etc/dl-cluster/allowed-images"
#: An entry: a registry host (with its port), then lower-case path components.
_ENTRY = re.compile(r"[A-Za-z0-9.-]+(?::[0-9]{1,5})?(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*")


class ImageNotAllowed(ValueError):
    """The image's repository is outside the stack's list; the message names both."""


def parse_entries(text: str) -> tuple[str, ...]:
    """The setting's comma-separated entries, trimmed, trailing ``/`` dropped, empties gone."""
    entries = (part.strip().rstrip("/") for part in text.split(","))
    return tuple(entry for entry in entries if entry)


def check_entries(entries: Iterable[str]) -> tuple[str, ...]:
    """The entries, each a registry or a repository prefix; ValueError naming one that is
    not (a scheme, a tag, a wildcard, upper case in a path: nothing here would ever match)."""
    listed = tuple(entries)
    for entry in listed:
        if not _ENTRY.fullmatch(entry):
            raise ValueError(f"{SETTING}: {entry!r} is not a registry or repository prefix "
                             f"(such as 123456789012.dkr.ecr.us-east-1.amazonaws.com/team or "
                             f"nvcr.io/nvidia)")
    return listed


def render_setting(entries: Iterable[str]) -> str:
    """The text of :data:`SETTING_FILE`: one entry a line."""
    return "".join(f"{entry}\n" for entry in entries)


def node_entries(root: str | Path = "/") -> tuple[str, ...]:
    """The list the installer wrote under ``root`` (none: no file, or one another user
    planted, which is read as empty: images refused)."""
    text = read_installed_file(Path(root) / SETTING_FILE)
    entries = parse_entries(text.replace("\n", ","))
    try:
        return check_entries(entries)
    except ValueError:
        return ()


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
