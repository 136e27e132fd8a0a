"""Logs as JSON lines with a request id, and nothing secret or personal in them.

A request id is taken from the caller's ``X-Request-ID`` (when it is a plain token) or made up; it is
held in a context variable for the request's task (and the tasks it starts), given back in the
response header, and carried into the jobs the request queues, so one id follows a query or an
upload through every step and job. Every record passes the ``Redactor`` before it is written: the
configured secrets' values, API keys (``rsk_...``), bearer tokens and database passwords are
replaced, and personal data is masked by the function the edge passes in (the guardrails' PII
masker), in the message and in the exception text alike.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import uuid
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from datetime import UTC, datetime

REQUEST_ID_HEADER = "X-Request-ID"
_request_id: ContextVar[str | None] = ContextVar("request_id", default=None)
_VALID_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_PATTERNS = (
    (re.compile(r"rsk_[A-Za-z0-9_-]{8,}"), "rsk_[REDACTED]"),  # this service's API keys
    (re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9._~+/=-]{8,}"), r"\1 [REDACTED]"),
    (re.compile(r"(?i)(postgres(?:ql)?(?:\+\w+)?://[^:/@\s]+:)[^@\s]+@"), r"\1***@"),
    (re.compile(r"(?i)([?&]password=)[^&\s]*"), r"\1***"),
)


def request_id() -> str | None:
    return _request_id.get()


def bind_request_id(candidate: str | None = None) -> str:
    """Use the caller's id when it is a plain token (no spaces or control characters, up to 128),
    else a new one; returns the id now bound to this context."""
    chosen = candidate if candidate and _VALID_ID.match(candidate) else uuid.uuid4().hex
    _request_id.set(chosen)
    return chosen


class Redactor:
    def __init__(self, secrets: Iterable[str] = (), mask_personal: Callable[[str], str] | None = None) -> None:
        # Longest first, so a secret containing another is replaced whole.
        self._secrets = sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True)
        self._mask_personal = mask_personal

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "[REDACTED]")
        for pattern, replacement in _PATTERNS:
            text = pattern.sub(replacement, text)
        return self._mask_personal(text) if self._mask_personal is not None else text


class RequestIdFilter(logging.Filter):
    """Stamps each record with the request id of the context that logs it (formatting may happen
    later, elsewhere: a queued handler, a test's capture)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            record.request_id = request_id()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request id, and the exception."""

    def __init__(self, redact: Redactor) -> None:
        super().__init__()
        self._redact = redact

    def format(self, record: logging.LogRecord) -> str:
        line = {"ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
                "level": record.levelname, "logger": record.name, "message": self._redact(record.getMessage())}
        rid = getattr(record, "request_id", None) or request_id()
        if rid:
            line["request_id"] = rid
        if record.exc_info:
            line["exception"] = self._redact(self.formatException(record.exc_info))
        return json.dumps(line, ensure_ascii=False)


class RedactingFormatter(logging.Formatter):
    """The human format, redacted the same way, with the request id when there is one."""

    def __init__(self, redact: Redactor) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")
        self._redact = redact

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        # Only the message is redacted, not the time and level around it (a date reads as digits).
        record.message = self._redact(record.message)
        return super().formatMessage(record)

    def formatException(self, ei) -> str:  # noqa: ANN001, N802
        return self._redact(super().formatException(ei))

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        rid = getattr(record, "request_id", None) or request_id()
        return f"{text} [request {rid}]" if rid else text


def configure(level: str, fmt: str, redact: Redactor) -> None:
    """Route the root logger to stderr in ``fmt`` ("json" or "text"), replacing earlier handlers."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(JsonFormatter(redact) if fmt == "json" else RedactingFormatter(redact))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
