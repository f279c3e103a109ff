"""Reading CDK context into a settings dataclass the same way for every stack.

Context arrives as strings from ``-c key=value`` or as JSON values from cdk.json; every bad
value fails synth with ``context key '<key>' ...``, the value and the limit. What each key
means, its default and its check come from the dataclass's field descriptions
(``constructs_lib.setting``); a key that looks like one of this app's but is none of them is
refused with the closest known key, instead of being silently ignored.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable
from typing import TypeVar

from constructs_lib import validation
from constructs_lib.setting import described_fields

T = TypeVar("T")

#: This app's context keys are camelCase identifiers. Keys of the CDK and its CLI have a
#: namespace (``@aws-cdk/core:...``, ``aws:cdk:...``, ``aws-cdk:...``, the lookup cache's
#: ``availability-zones:account=...``) or dashes (``acknowledged-issue-numbers``): they are
#: never this app's, so they are never checked.
_APP_KEY = re.compile(r"^[a-z][A-Za-z0-9]*$")


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

    def settings(self, cls: Callable[..., T]) -> T:
        """The settings dataclass ``cls`` with every context key it describes that is set
        (a raw key: given at all) parsed and checked; unset keys keep its defaults."""
        values: dict[str, object] = {}
        for field, desc in described_fields(cls):  # type: ignore[arg-type]
            given = self.get(desc.key) is not None if desc.raw else \
                self.text(desc.key) is not None
            if given:
                values[field.name] = self.checked(desc.key, lambda _n, v, d=desc: d.parse(v),
                                                  raw=desc.raw)
        return cls(**values)

    def one_of(self, *groups: tuple[str, ...]) -> None:
        """At most one key of each group is set; the error names the keys and their values."""
        for keys in groups:
            given = [k for k in keys if self.text(k) is not None]
            if len(given) > 1:
                raise validation.ConfigError(
                    "context keys " + " and ".join(f"'{k}'" for k in given) + " exclude each "
                    "other, got " + ", ".join(f"{k}={self.text(k)!r}" for k in given))


def refuse_unknown_keys(given: Iterable[str], known: Iterable[str]) -> None:
    """ConfigError for the first of this app's keys (camelCase, see ``_APP_KEY``) in ``given``
    that is not ``known``, naming the closest known key (compared without case, so
    ``workercount`` finds ``workerCount``)."""
    by_lower = {k.lower(): k for k in known}
    for key in sorted(given):
        if not _APP_KEY.match(key) or key in by_lower.values():
            continue
        close = difflib.get_close_matches(key.lower(), list(by_lower), n=1, cutoff=0.6)
        hint = f"; did you mean '{by_lower[close[0]]}'?" if close else \
            " (docs/settings.md lists the keys)"
        raise validation.ConfigError(f"unknown context key '{key}'{hint}")
