"""Logging setup for the daemon: plain text for people, or one JSON object per line for collectors.

Both formats carry the ``resource`` and ``device`` a record is about when the code gives them
(``log.info("...", extra={"resource": name, "device": device_id})``). JSON lines have ``time``
(UTC, ISO 8601 with milliseconds), ``level``, ``logger``, ``message``, those fields when present,
and ``exception`` with the traceback when there is one.

The boundary: formatting and handler setup only; modules log through ``logging.getLogger``.
"""

from __future__ import annotations

import logging
import sys
import time
import weakref
from typing import Any, TextIO

FORMATS = ("text", "json")
CONTEXT_FIELDS = ("resource", "device")
_OWN_HANDLERS: weakref.WeakSet[logging.Handler] = weakref.WeakSet()  # those setup_logging installed


def _timestamp(record: logging.LogRecord) -> str:
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{seconds}.{int(record.msecs):03d}Z"


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": _timestamp(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in CONTEXT_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                entry[name] = str(value)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        import json  # the JSON format only: text logs never need it

        return json.dumps(entry, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """``2026-01-02T03:04:05.678Z INFO cdiplug.deviceplugin.frontend [example.com/fpga fpga-0] message``."""

    def format(self, record: logging.LogRecord) -> str:
        context = " ".join(str(v) for name in CONTEXT_FIELDS if (v := getattr(record, name, None)) is not None)
        line = f"{_timestamp(record)} {record.levelname} {record.name}"
        if context:
            line += f" [{context}]"
        line += f": {record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        elif record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return line


def formatter(fmt: str) -> logging.Formatter:
    if fmt == "json":
        return JsonFormatter()
    if fmt == "text":
        return TextFormatter()
    raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {fmt!r}")


def setup_logging(fmt: str = "text", level: int | str = logging.INFO, stream: TextIO | None = None) -> logging.Handler:
    """Send every log record of the process to ``stream`` (stderr) in ``fmt``; returns the handler.

    Replaces handlers installed by an earlier call, so calling it twice does not double lines.
    """
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(formatter(fmt))
    _OWN_HANDLERS.add(handler)
    root = logging.getLogger()
    for old in [h for h in root.handlers if h in _OWN_HANDLERS]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    return handler
