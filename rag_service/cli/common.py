"""What every ``ragsvc`` command shares: the Typer app, settings and logging, the one place
service errors become a message and an exit code, JSON output, and opening a Runtime."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import sys
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any, ParamSpec, TypeVar

import typer
from pydantic import BaseModel, ValidationError
from rich.console import Console

from rag_service.config import Settings, get_settings
from rag_service.errors import InvalidInputError, RagServiceError
from rag_service.observability import logs
from rag_service.pipeline.guardrails import mask_pii

if TYPE_CHECKING:  # the runtime imports the whole service; commands open it only when they need it
    from rag_service.runtime import Runtime

P = ParamSpec("P")
R = TypeVar("R")

app = typer.Typer(
    name="ragsvc",
    help="rag-service: ingest documents and answer questions about them with cited answers.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
stderr = Console(stderr=True)
JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")]


def settings(long_running: bool = False) -> Settings:
    """The settings, and logging configured from them: JSON lines for the long-running processes
    (``long_running``: serve, worker) unless RAGSVC_LOG_FORMAT says otherwise; always redacted."""
    config = get_settings()
    fmt = config.log_format if config.log_format != "auto" else ("json" if long_running else "text")
    logs.configure(config.log_level, fmt, logs.Redactor(config.secret_values(), mask_personal=mask_pii))
    if config.log_level != "DEBUG":
        # Both narrate every step at INFO; their warnings and errors still show.
        for chatty in ("pgserver", "alembic", "procrastinate"):
            logging.getLogger(chatty).setLevel(logging.WARNING)
    return config


def handle_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Translate service errors into a one-line message and the error's exit code."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except RagServiceError as exc:
            where = f" in step {exc.step}" if exc.step else ""
            # One line however narrow the terminal (rich would wrap it): scripts grep it, people copy it.
            stderr.print(f"[bold red]error[/]{where}: {exc}", highlight=False, soft_wrap=True)
            raise typer.Exit(exc.exit_code) from None

    return wrapper


def parse_id(value: str, what: str) -> uuid.UUID:
    """A command's id argument, or a clear error naming what it should be."""
    try:
        return uuid.UUID(value)
    except ValueError:
        raise InvalidInputError(f"{value!r} is not {what} (a UUID)") from None


def emit_json(payload: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(payload, default=str) + "\n")


def validated(build: Callable[[], R]) -> R:
    """Build a request model from options; a validation error becomes one line naming the field."""
    try:
        return build()
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'input'}: {e['msg']}" for e in exc.errors())
        raise InvalidInputError(problems) from None


def run_with_runtime(work: Callable[[Runtime], Awaitable[R]], *, check_schema: bool = False) -> R:
    """Open a Runtime (off the event loop: it may start the embedded database), await
    ``work(runtime)``, close it."""
    from rag_service.runtime import Runtime

    config = settings()

    async def run() -> R:
        runtime = await asyncio.to_thread(Runtime.open, config)
        try:
            if check_schema:
                await runtime.check_schema()
            return await work(runtime)
        finally:
            await runtime.close()

    return asyncio.run(run())


def model_json(work: Callable[[Runtime], Awaitable[BaseModel]]) -> dict[str, Any]:
    """``run_with_runtime`` for work that returns a pydantic model: the model as JSON data."""

    async def as_json(runtime: Runtime) -> dict[str, Any]:
        return (await work(runtime)).model_dump(mode="json")

    return run_with_runtime(as_json)
