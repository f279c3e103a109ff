"""Reading CDK context values the same way for every stack.

Context arrives as strings from ``-c key=value`` or as JSON values from cdk.json; every bad
value fails synth with ``context key '<key>' ...`` and the value.
"""

from __future__ import annotations

from collections.abc import Callable

from constructs_lib import validation

_TRUE = {"true", "1", "yes"}
_FALSE = {"false", "0", "no", ""}


class ContextReader:
    """Typed access to a context getter such as ``app.node.try_get_context``."""

    def __init__(self, get: Callable[[str], object]) -> None:
        self.get = get

    def text(self, key: str) -> str | None:
        """The value as stripped text; unset or blank is None (lists are comma-joined)."""
        raw = self.get(key)
        if raw is None:
            return None
        if isinstance(raw, list):
            return ",".join(str(x) for x in raw)
        value = str(raw).strip()
        return value or None

    def checked(self, key: str, check: Callable[[str, object], object], *,
                raw: bool = False) -> object:
        """Run a validator from constructs_lib.validation, naming the context key on error
        (``context key 'workerCount' must be ...``). ``raw`` hands the validator the value as
        given (e.g. to refuse a blank one)."""
        try:
            return check(f"'{key}'", self.get(key) if raw else self.text(key))
        except validation.ConfigError as exc:
            raise validation.ConfigError(f"context key {exc}") from None

    def flag(self, key: str) -> bool | None:
        """true/false/yes/no/1/0 (or a JSON boolean); None when unset."""
        value = self.get(key)
        if value is None:
            return None
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise validation.ConfigError(f"context key '{key}' must be true or false, got {value!r}")
