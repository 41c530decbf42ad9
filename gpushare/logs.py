"""Structured logging shared by every gpushare process: one JSON object per line on stderr.

Fields passed with ``extra=`` land as top-level keys, so log pipelines can filter on ``pod``, ``node``,
``verb`` and the like without parsing sentences.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import orjson

# Attributes every LogRecord carries; anything else on a record came from ``extra=``.
# (uvicorn adds ``color_message``, the same text with terminal colour codes.)
_STANDARD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message", "asctime", "color_message"}

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")

# How much of a text that came from outside (a pod name, a quantity, an annotation) any answer, Event or log line
# repeats: enough to recognise it, never enough for one request to flood a log or an Event.
CLIP_CHARS = 80


def clip(text: object, limit: int = CLIP_CHARS) -> str:
    """``text`` as ``repr`` shows it, cut to ``limit`` characters with the original length said.

    Every place that echoes user text goes through here, so a 20 MB pod name costs 100 bytes of log.
    """
    shown = repr(text) if isinstance(text, str) else repr(str(text))
    if len(shown) <= limit:
        return shown
    return f"{shown[:limit]}... ({len(str(text))} characters)"


class JSONFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD_ATTRS and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


def configure_logging(level: str = "INFO") -> None:
    """Send every logger's records to stderr as JSON lines at ``level`` (DEBUG, INFO, WARNING, ERROR)."""
    name = level.upper()
    if name not in LEVELS:
        raise ValueError(f"Unknown log level {level!r}; use one of {', '.join(LEVELS)}.")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JSONFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(name)
    # uvicorn installs its own handlers; route its records through ours instead.
    for logger_name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(logger_name)
        logger.handlers.clear()
        logger.propagate = True
