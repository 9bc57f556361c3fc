"""The application's log lines: text (the default) or one JSON object per line
(``KANDEV_LOG_FORMAT=json``, python-json-logger), every field redacted
(kandev_es.redaction), each carrying the request it was written for
(``serving.RequestFields``)."""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from typing import IO, Any

from pythonjsonlogger.json import JsonFormatter

from kandev_es.observability.serving import FIELDS, RequestFields
from kandev_es.redaction import may_hold_secret, redact

TEXT_FORMAT = "%(asctime)s [%(process)d] %(levelname)s %(name)s %(message)s"
ACCESS_LOGGER = "kandev_es.access"
# The JSON keys, in order (the request's fields after the record's own).
JSON_KEYS = ("time", "level", "logger", "message", *FIELDS)


class TextLines(logging.Formatter):
    """The classic line, ``request_id=…`` at its end while serving a request."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        request_id = getattr(record, "request_id", None)
        if request_id and f"request_id={request_id}" not in line:
            line += f" request_id={request_id}"
        return redact(line)


class JsonLines(JsonFormatter):
    """time, level, logger, message and the request's fields, then any
    exception; every string in it redacted."""

    def __init__(self) -> None:
        super().__init__(
            ["levelname", "name", "message", *FIELDS],
            rename_fields={"levelname": "level", "name": "logger"},
            # Only the listed fields: no other attribute of a record is written.
            reserved_attrs=[*logging.LogRecord("", 0, "", 0, "", None, None).__dict__, "taskName",
                            "message", "asctime"],
        )

    def add_fields(
        self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]
    ) -> None:
        log_data["time"] = datetime.fromtimestamp(record.created, UTC).isoformat(
            timespec="milliseconds"
        )
        super().add_fields(log_data, record, message_dict)

    def process_log_record(self, log_data: dict[str, Any]) -> dict[str, Any]:
        # Most records are flat and hold no secret: one test over their
        # strings together instead of one per field (the access line's cost).
        values = log_data.values()
        if not any(isinstance(value, dict | list | tuple) for value in values):
            strings = "\n".join(value for value in values if type(value) is str)
            if not may_hold_secret(strings):
                return log_data
        return {key: _redacted(value) for key, value in log_data.items()}


def _redacted(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {key: _redacted(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_redacted(item) for item in value]
    return value


def handler(log_format: str, stream: IO[str] | None = None) -> logging.Handler:
    """A handler writing ``log_format`` lines with the request's fields, on
    ``stream`` (stderr by default)."""
    made = logging.StreamHandler(stream or sys.stderr)
    made.setFormatter(JsonLines() if log_format == "json" else TextLines())
    made.addFilter(RequestFields())
    return made


def configure(level: str, log_format: str, logger: logging.Logger | None = None) -> None:
    """``logger`` (the root's by default) writes to stderr at ``level`` in
    ``log_format``; the access line is written at any level."""
    target = logger or logging.getLogger()
    for old in list(target.handlers):
        target.removeHandler(old)
    target.addHandler(handler(log_format))
    target.setLevel(level.upper())
    access = logging.getLogger(ACCESS_LOGGER)
    access.setLevel(logging.INFO)
