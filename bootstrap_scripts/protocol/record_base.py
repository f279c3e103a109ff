"""The one (de)serialiser every record of the cluster protocol shares: :class:`Record`.

Every record is a frozen dataclass (:func:`record`) with this mixin. ``to_json`` writes
sorted, indented JSON; ``from_json``/``from_dict`` check each field against its annotation
and raise :class:`~bootstrap_scripts.protocol.errors.ProtocolError` naming the file and the
field. Unknown fields are ignored, so a newer writer does not break an older reader.

Kept apart from the record types (``records``, ``managed_records``, ``jobs``, the agent's
``master_state``) so that a module that only handles records in general (``store``,
``userfiles``, the signed-record readers) depends on the machinery, not on every record.
"""

from __future__ import annotations

import dataclasses
import json
import re
import types
import typing
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

from bootstrap_scripts.protocol.errors import ProtocolError

R = TypeVar("R", bound="Record")

#: The deepest nesting (arrays and objects) a record may have. The deepest record of the
#: protocol (a job spec: shares, procs, a listener) is 6 levels; a user's or a worker's
#: root's file nested 100,000 deep would make ``json.loads``, which recurses, raise
#: RecursionError from wherever it is called, so depth is counted before parsing.
MAX_DEPTH = 64

#: A JSON string, escapes included (the unrolled form: linear, no backtracking).
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_OPENERS = str.maketrans({"[": "(", "{": "("})
_CLOSERS = str.maketrans({"]": ")", "}": ")"})


def depth(text: str) -> int:
    """The deepest nesting of arrays and objects in JSON ``text``, counted without
    recursing (brackets inside strings do not count). For text that is not valid JSON the
    count may be too high, never too low for the part a parser would read."""
    bare = _STRING.sub("", text).translate(_OPENERS).translate(_CLOSERS)
    deepest = level = 0
    for part in re.findall(r"[()]+", bare):
        for char in part:
            level += 1 if char == "(" else -1
            deepest = max(deepest, level)
    return deepest


def loads(text: str | bytes, *, source: str = "", max_depth: int = MAX_DEPTH) -> Any:
    """Decode JSON ``text`` the one safe way: nesting deeper than ``max_depth`` is refused
    before ``json.loads`` runs (it recurses), and every failure of decoding (bad UTF-8, bad
    JSON, an integer of more digits than Python converts) is a
    :class:`~bootstrap_scripts.protocol.errors.ProtocolError` naming ``source``: a reader
    catches one error type and never dies of a record's shape."""
    where = source or "document"
    if isinstance(text, bytes | bytearray):
        try:
            text = bytes(text).decode()
        except UnicodeDecodeError as exc:
            raise ProtocolError(f"not UTF-8 text: {exc.reason} at byte {exc.start}",
                                source=where) from None
    if not isinstance(text, str):
        raise ProtocolError(f"expected JSON text, got {type(text).__name__}", source=where)
    found = depth(text)
    if found > max_depth:
        raise ProtocolError(f"nested deeper than {max_depth} levels ({found}): not parsed",
                            source=where)
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"not valid JSON: {exc}", source=where) from None


def _convert(value: Any, hint: Any, *, source: str, field: str) -> Any:
    """``value`` (decoded JSON) as ``hint``, or ProtocolError."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for arg in (a for a in args if a is not type(None)):
            try:
                return _convert(value, arg, source=source, field=field)
            except ProtocolError:
                continue
        raise ProtocolError(f"expected {hint}, got {value!r}", source=source, field=field)
    if hint is Any:
        return value
    if hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif hint is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            try:
                return float(value)
            except OverflowError:  # an integer beyond any float: refused below
                pass
    elif hint is str:
        if isinstance(value, str):
            return value
    elif origin is tuple:
        if isinstance(value, list | tuple):
            item = args[0] if args else Any
            return tuple(_convert(v, item, source=source, field=f"{field}[{i}]")
                         for i, v in enumerate(value))
    elif origin is dict:
        if isinstance(value, Mapping):
            key_t, val_t = args if args else (Any, Any)
            return {_convert(k, key_t, source=source, field=field):
                    _convert(v, val_t, source=source, field=f"{field}.{k}")
                    for k, v in value.items()}
    elif isinstance(hint, type) and issubclass(hint, Record):
        return hint.from_dict(value, source=source, prefix=f"{field}.")
    else:  # pragma: no cover - a record declared a type this module does not know
        raise TypeError(f"unsupported field type {hint!r} for {field}")
    raise ProtocolError(f"expected {getattr(hint, '__name__', hint)}, got {value!r}",
                        source=source, field=field)


def _plain(value: Any) -> Any:
    if isinstance(value, Record):
        return value.to_dict()
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


class Record:
    """Mixin for protocol dataclasses: strict JSON in, sorted JSON out."""

    #: What the record is, for messages ("executor heartbeat", "drain request", ...).
    KIND: ClassVar[str] = "record"

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_dict(cls: type[R], data: Any, *, source: str = "", prefix: str = "") -> R:
        source = source or cls.KIND
        if not isinstance(data, Mapping):
            raise ProtocolError(f"a {cls.KIND} must be a JSON object, got {type(data).__name__}",
                                source=source, field=prefix.rstrip("."))
        hints = typing.get_type_hints(cls)
        kwargs: dict[str, Any] = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            name = f"{prefix}{f.name}"
            if f.name not in data:
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    raise ProtocolError("missing", source=source, field=name)
                continue
            kwargs[f.name] = _convert(data[f.name], hints[f.name], source=source, field=name)
        try:
            return cls(**kwargs)
        except ProtocolError:
            raise
        except (TypeError, ValueError, ArithmeticError) as exc:
            raise ProtocolError(str(exc), source=source) from exc

    @classmethod
    def from_json(cls: type[R], text: str, *, source: str = "") -> R:
        return cls.from_dict(loads(text, source=source or cls.KIND), source=source)


def record(cls: type[R]) -> type[R]:
    """Decorator: a frozen dataclass that is also a :class:`Record`."""
    return dataclasses.dataclass(frozen=True)(cls)
