"""The one error type of the cluster protocol.

Every record read from the shared file system, a node's disk or the master queue is
checked on the way in; what does not fit raises :class:`ProtocolError` naming the file (or
message) and the field, so a log line says exactly which document is bad and why.
"""

from __future__ import annotations


class ProtocolError(ValueError):
    """A document does not follow the protocol. ``source`` is the file path or message
    description it came from, ``field`` the offending field ("" for the whole document)."""

    def __init__(self, message: str, *, source: str = "", field: str = "") -> None:
        self.source = source
        self.field = field
        where = " ".join(part for part in (source, f"field {field!r}" if field else "") if part)
        super().__init__(f"{where}: {message}" if where else message)
