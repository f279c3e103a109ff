"""One JSON object per log line, so CloudWatch Logs Insights can filter on any field.

The Lambda Python runtime's root logger prefixes every line with a timestamp and request id
(unless the function's log format is JSON), which breaks ``fields @message | filter ...``
queries on our decision records. We therefore write our own lines straight to stdout through
a dedicated, non-propagating logger: every decision, skip and error is one parseable object.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

LOGGER_NAME = "capacity_adjuster"
_VALID_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class _JsonFormatter(logging.Formatter):
    """Render ``record.fields`` plus level/time/message as a single JSON line."""

    def format(self, record: logging.LogRecord) -> str:
        body: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            for key, value in fields.items():
                body.setdefault(key, value)
        if record.exc_info:
            body["exception"] = self.formatException(record.exc_info)
        # default=str: a hostile notification may carry values json cannot encode natively;
        # logging must never be the thing that raises.
        return json.dumps(body, default=str)  # ASCII-escaped: a lone surrogate cannot break it


class JsonLogger:
    """Thin wrapper: ``log.info("decision", asg=..., action=...)`` → one JSON line."""

    def __init__(self, logger: logging.Logger, context: dict[str, Any] | None = None) -> None:
        self._logger = logger
        self._context = dict(context or {})

    def bind(self, **context: Any) -> JsonLogger:
        """A logger whose lines also carry ``context`` (e.g. the record index)."""
        return JsonLogger(self._logger, {**self._context, **context})

    def _log(self, level: int, msg: str, exc_info: bool, fields: dict[str, Any]) -> None:
        self._logger.log(
            level, msg, exc_info=exc_info, extra={"fields": {**self._context, **fields}}
        )

    def debug(self, msg: str, **fields: Any) -> None:
        self._log(logging.DEBUG, msg, False, fields)

    def info(self, msg: str, **fields: Any) -> None:
        self._log(logging.INFO, msg, False, fields)

    def warning(self, msg: str, **fields: Any) -> None:
        self._log(logging.WARNING, msg, False, fields)

    def error(self, msg: str, exc_info: bool = False, **fields: Any) -> None:
        self._log(logging.ERROR, msg, exc_info, fields)


def get_logger(level_name: str | None) -> tuple[JsonLogger, str | None]:
    """Configure the module logger for this invocation.

    Returns the logger and, when ``level_name`` is not a valid level, a warning text to log
    (the caller logs it as JSON so a typo in LOG_LEVEL is visible, not fatal).
    """
    logger = logging.getLogger(LOGGER_NAME)
    logger.propagate = False
    # The stream is resolved per call so test capture (and a replaced sys.stdout) works.
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(_JsonFormatter())
    logger.addHandler(handler)

    warning = None
    wanted = (level_name or "INFO").strip().upper()
    if wanted not in _VALID_LEVELS:
        warning = f"LOG_LEVEL={level_name!r} is not one of {', '.join(_VALID_LEVELS)}; using INFO"
        wanted = "INFO"
    logger.setLevel(wanted)
    return JsonLogger(logger), warning
