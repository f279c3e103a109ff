"""One typed description per stack setting: its context key, default, bounds, check and doc.

A stack's settings are a frozen dataclass (``ClusterSettings``, ``EmrSettings``) whose fields
carry a :class:`Setting` in their metadata, the way aws-cdk-lib documents each prop with its
``@default``. Everything else is derived from that one description, so nothing can drift:

- the construct's prop defaults (the constructs use the dataclass's defaults);
- the context keys app.py accepts, how each value is parsed and checked, and the refusal of
  an unknown key with the closest known one (``stacks.context``);
- the README's settings table (``python -m stacks.settings_doc``; a test compares them);
- the defaults the emulator's directly-built clusters use (``emulator.resources``).

This module imports no CDK: it only describes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_METADATA_KEY = "setting"

Check = Callable[..., Any]


@dataclass(frozen=True)
class Setting:
    """How one field of a settings dataclass is given as CDK context and documented.

    ``check(name, value)`` turns the context value (text from ``-c``, or JSON from cdk.json)
    into the field's value or raises ``ConfigError`` naming ``name``, the value and the limit;
    with ``minimum``/``maximum`` it is called as ``check(name, value, minimum=, maximum=)``.
    ``raw`` hands it the value as given (a JSON list, a blank string that is a mistake rather
    than "unset"). ``default_doc`` is the README's default when the field's default is None or
    computed from other settings; ``accepts`` the README's "accepted values" when there are
    no bounds to print.
    """

    key: str
    doc: str
    check: Check
    default_doc: str | None = None
    accepts: str = ""
    minimum: int | None = None
    maximum: int | None = None
    raw: bool = False

    def parse(self, value: object) -> object:
        """The field's value for a context value, or ConfigError naming the key."""
        name = f"'{self.key}'"
        if self.minimum is not None and self.maximum is not None:
            return self.check(name, value, minimum=self.minimum, maximum=self.maximum)
        return self.check(name, value)

    @property
    def limits(self) -> str:
        """The accepted values as the README prints them."""
        if self.minimum is not None and self.maximum is not None:
            return f"{self.minimum} to {self.maximum}"
        return self.accepts


def setting(key: str, default: object, doc: str, check: Check, **options: Any) -> Any:
    """A dataclass field described by a :class:`Setting` (see the module docstring)."""
    return dataclasses.field(default=default,
                             metadata={_METADATA_KEY: Setting(key, doc, check, **options)})


def described_fields(cls: type) -> list[tuple[dataclasses.Field, Setting]]:
    """The settings dataclass's fields with their descriptions, in declaration order."""
    return [(f, f.metadata[_METADATA_KEY]) for f in dataclasses.fields(cls)
            if _METADATA_KEY in f.metadata]


def context_keys(cls: type) -> dict[str, str]:
    """Context key -> field name of a settings dataclass."""
    return {s.key: f.name for f, s in described_fields(cls)}


def default_of(cls: type, field_name: str) -> Any:
    """The default of one field (what the construct uses when the prop is not given)."""
    for f in dataclasses.fields(cls):
        if f.name == field_name:
            return f.default
    raise KeyError(field_name)
