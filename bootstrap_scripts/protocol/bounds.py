"""The documented range of every number the node agent reads, checked on the way in.

JSON numbers arrive as Python ints of any size, floats that may be ``inf`` or ``nan``
(``1e400``, ``NaN``), or booleans (``true`` is an int to Python). Any of these deep inside
the agent ends in an ``OverflowError`` from ``int(inf)``, a comparison that is never true,
or a hostfile with ``slots=10**100``. So each number of a master-queue message
(:mod:`.messages`) and of each record the agent reads (:mod:`.membership`, :mod:`.state`)
is checked where it is parsed: its type (an integer field takes an integer, never a bool
or a float), that it is finite, and that it lies in the range below, which
docs/protocol.md lists ("Numbers"). A value outside is refused with
:class:`~bootstrap_scripts.protocol.errors.ProtocolError` naming the field and the value.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from bootstrap_scripts.protocol.errors import ProtocolError

#: Instances in one group, nodes in one membership: far above any group this stack builds
#: (the largest simulated cluster has 1,024 nodes).
MAX_NODES = 10_000
#: GPUs of one instance (the largest EC2 GPU instances have 8 or 16).
MAX_GPUS = 64
#: Membership generations: one per change, so 2**31 - 1 is never reached honestly.
MAX_GENERATION = 2**31 - 1
#: Linux's largest pid_max.
MAX_PID = 2**22
#: Timestamps, seconds since the epoch: up to the end of year 9999.
MAX_TIME = 253_402_300_799.0
#: Durations in seconds: a year.
MAX_SECONDS = 366 * 86_400.0
#: Attempts of one drain's lifecycle call.
MAX_ATTEMPTS = 1_000

COUNT = (0, MAX_NODES)
TIME = (0.0, MAX_TIME)
SECONDS = (0.0, MAX_SECONDS)


def whole(value: Any, *, field: str, low: int, high: int, source: str = "") -> int:
    """``value`` if it is an int (not a bool) in ``low..high``; else ProtocolError."""
    if isinstance(value, int) and not isinstance(value, bool) and low <= value <= high:
        return value
    raise ProtocolError(f"expected a whole number {low}..{high}, got {_shown(value)}",
                        source=source, field=field)


def real(value: Any, *, field: str, low: float, high: float, source: str = "") -> float:
    """``value`` as a float if it is a finite int or float (not a bool) in ``low..high``."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        with_float = _as_float(value)
        if with_float is not None and low <= with_float <= high:
            return with_float
    raise ProtocolError(f"expected a finite number {low:g}..{high:g}, got {_shown(value)}",
                        source=source, field=field)


def check_fields(rec: Any, ranges: dict[str, tuple[float, float]], *, source: str = "") -> Any:
    """Check the numeric fields ``ranges`` names on the dataclass ``rec`` (None values of
    optional fields pass); ``rec`` itself, or ProtocolError naming the first bad field."""
    for name, (low, high) in ranges.items():
        value = getattr(rec, name)
        if value is None:
            continue
        if isinstance(low, int) and isinstance(high, int):
            whole(value, field=name, low=low, high=high, source=source)
        else:
            real(value, field=name, low=low, high=high, source=source)
    return rec


def numeric_fields(cls: type) -> set[str]:
    """The fields of dataclass ``cls`` annotated int or float (optional ones included)."""
    return {f.name for f in dataclasses.fields(cls)
            if any(t in str(f.type) for t in ("int", "float"))}


def _as_float(value: int | float) -> float | None:
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _shown(value: Any) -> str:
    """``repr(value)``, shortened: a 5,000-digit integer must not flood the log."""
    try:
        text = repr(value)
    except ValueError:  # an int beyond Python's digit limit for str()
        return f"an integer of about {value.bit_length() * 0.30103:.0f} digits"
    return text if len(text) <= 60 else f"{text[:40]}... ({len(text)} characters)"
