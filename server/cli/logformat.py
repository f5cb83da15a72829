"""How ``coordinator serve`` writes its log: one line per record, as ``key=value`` text (the
default, easy to read and to grep) or as JSON lines (``--log-format json``, for a log pipeline).

Every line has ``ts`` (UTC, ISO 8601 with milliseconds), ``level`` and ``logger``; an event of
:mod:`fedsketch.server.service.events` adds ``event`` and its fields, any other record ``msg``
(and ``exc``, its traceback). In text, a value that is empty or holds a space, a quote, an
``=`` or a control character is written as a JSON string, so every line splits back into its
pairs; None is ``null``. Values are ids, states, codes, numbers and the coordinator's own
reasons: never a payload.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone
from typing import Any

#: The formats ``--log-format`` takes.
LOG_FORMATS = ("text", "json")


def _pairs(record: logging.LogRecord, formatter: logging.Formatter) -> dict[str, Any]:
    """The record's fields in line order."""
    at = datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds")
    pairs: dict[str, Any] = {"ts": at.replace("+00:00", "Z"), "level": record.levelname.lower(),
                             "logger": record.name}
    event = getattr(record, "event", None)
    if event is not None:
        pairs["event"] = event
        pairs.update(getattr(record, "fields", {}))
    else:
        pairs["msg"] = record.getMessage()
    if record.exc_info:
        pairs["exc"] = formatter.formatException(record.exc_info)
    return pairs


def _text_value(value: Any) -> str:
    if value is None:
        return "null"
    text = str(value)
    if text and text.isprintable() and not any(c in text for c in ' "=\\'):
        return text
    return json.dumps(text, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """``key=value`` pairs separated by spaces (module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        return " ".join(f"{k}={_text_value(v)}" for k, v in _pairs(record, self).items())


class JsonFormatter(logging.Formatter):
    """One JSON object per line (module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(_pairs(record, self), ensure_ascii=False, default=str)


def configure(log_format: str) -> None:
    """Send every INFO record and above to stderr in ``log_format`` (one of :data:`LOG_FORMATS`)."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"--log-format must be one of {', '.join(LOG_FORMATS)}, got {log_format!r}")
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
