"""Which staged objects botocore checked against S3's checksum, and the warning for the rest.

Why: ``If-Match`` and the size say which object and how long; only the checksum says the
bytes on disk are the bytes S3 stored. botocore checks it by itself (its default
``response_checksum_validation = when_supported`` asks S3 for it with ``ChecksumMode``), but
only in the algorithms it can compute: CRC32, SHA-1 and SHA-256 with the standard library;
CRC32C and CRC64NVME (S3's default for objects uploaded without a checksum) only when
``awscrt`` is importable (botocore/httpchecksum.py: ``_CHECKSUM_CLS`` gains them under
``HAS_CRT``). Whatever it cannot check it skips, saying so only at debug level. So the
stager looks at every response, counts the objects left unchecked and says why, once, in
its log and in the job's ``staging.json``; with ``awscrt`` on the nodes CRC32C and
CRC64NVME objects are checked and no longer counted (nothing here special-cases it: the
same test, whether botocore wrapped the body).

``--data-checksums required`` (``REQUIRED``) is for a job that must not train on bytes
nobody checked: the stager then refuses the first object botocore cannot check
(``Unverifiable``, naming why and what to do) instead of counting it, and fetches an
object larger than the part size in one GetObject rather than in ranges. Why that is
enough for those: botocore's ``handle_checksum_body`` checks whichever
``x-amz-checksum-<algorithm>`` header the response carries (not a composite ``...-N``
value), whether or not the request had a ``Range``; S3 sends the object's checksum only for
a request of the whole object, so the one GetObject is checked like any small object, at
the cost of that object's transfer on one connection.
"""

from __future__ import annotations

from pathlib import Path

from bootstrap_scripts.node import node_region

#: Why a response's body was not checked (``checksum_gap``), besides an algorithm's name.
RANGED = "ranged"
NO_CHECKSUM = "none"
COMPOSITE = "composite"
#: The warning's words for those, and what can be done about each.
EXPLAINED = {
    RANGED: "fetched in ranges (objects over the part size: S3 returns no checksum for a "
            "range)",
    NO_CHECKSUM: "with no checksum in S3 (uploaded before S3 kept one; copy them in place "
                 "to add one)",
    COMPOSITE: "with a multipart upload's checksum of its parts' checksums (botocore cannot "
               "check it against the whole object)",
}
#: ``--data-checksums``: stage unchecked objects and say so, or refuse them.
WARN = "warn"
REQUIRED = "required"
MODES = (WARN, REQUIRED)
#: Under the node root: the cluster's default mode, the stack's ``dataChecksums`` setting,
#: written by the installer from the user data's ``--data-checksums`` (every node has it,
#: since ``dl-run`` runs on any of them). ``dl-run --data`` without ``--data-checksums``
#: takes it; a node installed before the setting existed has no file and keeps ``WARN``.
SETTING_FILE = "etc/dl-cluster/data-checksums"
#: What to do about an object refused under ``REQUIRED``, besides ``CRT_ADVICE`` (a range
#: is never refused: ``REQUIRED`` fetches every object whole).
TO_DO = {
    NO_CHECKSUM: "copy it in place with a checksum algorithm (CopyObject with "
                 "ChecksumAlgorithm CRC32 gives it one)",
    COMPOSITE: "upload it again in one part, or as a multipart upload with a full-object "
               "checksum (ChecksumType FULL_OBJECT, CRC32)",
}
CRT_ADVICE = ("botocore checks those algorithms only with awscrt: install it on the nodes "
              "(pip install 'botocore[crt]' into the tools' interpreter)")


def render_setting(mode: str) -> str:
    """The text of :data:`SETTING_FILE` for ``mode`` (the installer's parser took only one
    of :data:`MODES`; :func:`node_default` reads anything else as ``WARN``)."""
    return mode + "\n"


def node_default(root: str | Path = "/") -> str:
    """The cluster's default ``--data-checksums`` mode as the installer wrote it under
    ``root``; :data:`WARN` when there is no such file (a node installed before the setting,
    a test root) or it holds no mode. Read as every installed file is (no link followed,
    root's or ours only: a file another user planted must not steer the stager)."""
    mode = node_region.read_installed_file(Path(root) / SETTING_FILE).strip()
    return mode if mode in MODES else WARN


def checksum_gap(response: dict, ranged: bool) -> str:
    """"" when botocore checks this GetObject's body against the checksum S3 sent (it then
    wraps the body in its ``StreamingChecksumBody``, which raises at the end of a body whose
    checksum differs: botocore/httpchecksum.py, ``handle_checksum_body``); else why not: the
    algorithm S3 sent that this botocore cannot compute (``CRC64NVME``...), ``COMPOSITE``,
    ``RANGED`` or ``NO_CHECKSUM``."""
    from botocore.httpchecksum import StreamingChecksumBody

    if isinstance(response.get("Body"), StreamingChecksumBody):
        return ""
    headers = response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
    sent = {name.removeprefix("x-amz-checksum-").upper(): value
            for name, value in headers.items()
            if name.startswith("x-amz-checksum-") and name != "x-amz-checksum-type"}
    if any("-" in value for value in sent.values()):
        return COMPOSITE
    if sent:
        return "/".join(sorted(sent))
    return RANGED if ranged else NO_CHECKSUM


def unverified_warning(unverified: dict[str, str], copied: int) -> str:
    """The one warning line for objects staged without a checksum check ("" if none): how
    many of the ``copied``, why, and what to do."""
    if not unverified:
        return ""
    why: dict[str, int] = {}
    for reason in unverified.values():
        why[reason] = why.get(reason, 0) + 1
    parts = [f"{n} {EXPLAINED.get(reason, f'with {reason}')}"
             for reason, n in sorted(why.items())]
    if any(reason not in EXPLAINED for reason in why):
        parts.append(CRT_ADVICE)
    return (f"warning: {len(unverified)} of {copied} object(s) staged without a checksum "
            f"check: " + "; ".join(parts))


class Unverifiable(Exception):
    """``--data-checksums required`` and botocore did not check this object's body:
    ``gap`` is ``checksum_gap``'s answer; the text says why and what to do."""

    def __init__(self, gap: str) -> None:
        self.gap = gap
        if gap in EXPLAINED:
            why, to_do = f"it is an object {EXPLAINED[gap]}", TO_DO.get(gap, "")
        else:
            why, to_do = f"its checksum in S3 is {gap}", CRT_ADVICE
        super().__init__(f"refused by --data-checksums {REQUIRED}, its bytes could not be "
                         f"checked against S3's checksum: {why}. To stage it: "
                         + (f"{to_do}; or " if to_do else "")
                         + f"accept it unchecked with --data-checksums {WARN}")
