"""The error hierarchy. Errors are raised anywhere and translated once, at the edges.

The HTTP edge maps ``status_code`` to a JSON problem body, the CLI prints ``str(error)`` and exits
with ``exit_code``. Anything that is not a :class:`RagServiceError` is a bug and is logged as one.
"""

from __future__ import annotations

from typing import ClassVar


class RagServiceError(Exception):
    """Base class for errors whose message is meant for the user."""

    status_code: int = 500
    exit_code: int = 1
    title: str = "internal error"

    def __init__(self, message: str, *, stage: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.stage = stage
        # The plan step that failed, set by the executor (``retrieve-2``, ``generate``...).
        self.step: str | None = None

    def __str__(self) -> str:
        return f"{self.stage}: {self.message}" if self.stage else self.message


class ConfigError(RagServiceError):
    """A setting is missing or has a bad value."""

    status_code = 500
    exit_code = 2
    title = "configuration error"


class InvalidInputError(RagServiceError):
    """The caller sent something we cannot use; the message says what to fix."""

    status_code = 422
    exit_code = 2
    title = "invalid input"


class PatternTooCommonError(InvalidInputError):
    """A pattern search stopped early: more chunks match than the caller allowed (``max_matches``)."""


class UnauthorizedError(RagServiceError):
    """The request carries no API key, or one that is unknown or revoked (HTTP 401)."""

    status_code = 401
    exit_code = 2
    title = "unauthorized"
    # Sent with the problem body: RFC 9110 requires a challenge on every 401.
    headers: ClassVar[dict[str, str]] = {"WWW-Authenticate": "Bearer"}


class ForbiddenError(RagServiceError):
    """The key is valid but its role or scope does not allow this (HTTP 403)."""

    status_code = 403
    exit_code = 2
    title = "forbidden"


class NotFoundError(RagServiceError):
    status_code = 404
    exit_code = 3
    title = "not found"


class ConflictError(RagServiceError):
    """The request conflicts with the current state (another reviewer holds the item, it is
    already decided). ``fields`` are JSON values the problem body carries besides the message."""

    status_code = 409
    exit_code = 6
    title = "conflict"

    def __init__(self, message: str, *, fields: dict[str, str | int | float | bool | None] | None = None,
                 stage: str | None = None) -> None:
        super().__init__(message, stage=stage)
        self.fields = dict(fields or {})


class DatabaseUnavailableError(RagServiceError):
    """PostgreSQL could not be reached or started."""

    status_code = 503
    exit_code = 4
    title = "database unavailable"


class StorageNotWritableError(DatabaseUnavailableError):
    """PostgreSQL cannot write its files: their file system is read-only, or their folder is not
    writable. The database itself may answer reads; what was being written was not saved."""

    title = "database storage not writable"


class StorageFullError(StorageNotWritableError):
    """The disk that holds the database's files is full (HTTP 507 Insufficient Storage)."""

    status_code = 507
    title = "insufficient storage"


class DataDirInUseError(DatabaseUnavailableError):
    """The embedded database's data dir is held by another process (a stale or foreign
    postmaster.pid, a server that does not answer, a start-up lock that is not released)."""

    title = "data dir in use"


class DatabaseTimeoutError(RagServiceError):
    """A query ran longer than its time limit and was cancelled."""

    status_code = 504
    exit_code = 4
    title = "database timeout"


class SchemaMismatchError(RagServiceError):
    """The database schema does not match this version or this configuration."""

    status_code = 503
    exit_code = 4
    title = "schema mismatch"


class ProviderError(RagServiceError):
    """An embedding, LLM or reranking provider failed."""

    status_code = 502
    exit_code = 5
    title = "provider error"


class PayloadTooLargeError(RagServiceError):
    """An upload is over the size limit."""

    status_code = 413
    exit_code = 2
    title = "payload too large"


class StepFailedError(RagServiceError):
    """A pipeline step failed with an unexpected error (a bug, logged with its traceback where it
    happened); the message names the step and nothing of the error's text."""

    status_code = 500
    exit_code = 1
    title = "pipeline step failed"


class MissingCapabilityError(RagServiceError):
    """The store behind this service cannot do what was asked (it lacks, e.g., pattern search)."""

    status_code = 501
    exit_code = 5
    title = "not supported by this store"


class StepTimeoutError(RagServiceError):
    """A pipeline step ran out of its time budget and had no fallback left."""

    status_code = 504
    exit_code = 5
    title = "timed out"


class RetrievalUnavailableError(RagServiceError):
    """Every retrieval strategy failed (for reasons other than the caller's input)."""

    status_code = 503
    exit_code = 5
    title = "retrieval unavailable"


class RateLimitedError(RagServiceError):
    """A key (or, keyless, an address) sent more requests than RAGSVC_RATE_LIMIT allows."""

    status_code = 429
    exit_code = 5
    title = "too many requests"

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message)
        self.headers = {"Retry-After": str(max(1, retry_after_s))}


class OverloadedError(RagServiceError):
    """The process is at its bound of work in flight (queries, queued jobs): try again shortly."""

    status_code = 503
    exit_code = 5
    title = "overloaded"

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message)
        self.headers = {"Retry-After": str(max(1, retry_after_s))}
