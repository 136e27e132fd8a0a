"""Rendering console pages: the Jinja2 environment, the page response with its security headers,
and ``ConsolePage``, the route class that turns errors into pages instead of JSON problems."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.routing import APIRoute
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from pydantic import ValidationError

from rag_service.domain import collection_name
from rag_service.errors import InvalidInputError, RagServiceError

SIGN_IN = "/review/login"
# Pages are plain HTML with inline CSS and inline SVG: nothing else may load or run. No script
# runs at all, so a page that somehow carried markup it should not could still do nothing.
_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
                               "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    # Pages show review material (questions, answers): keep them out of shared caches and history.
    "Cache-Control": "no-store",
}


class SignInRequired(Exception):  # noqa: N818 - a redirect, not an error
    """No live session: the console redirects to the sign-in page."""


def _number(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _percent(value: float | None) -> str:
    return "–" if value is None else f"{value * 100:.0f}%"


def _age(seconds: float) -> str:
    for unit, size in (("d", 86_400), ("h", 3_600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"


def _when(value: datetime | None) -> str:
    return "–" if value is None else value.strftime("%Y-%m-%d %H:%M:%S UTC")


TEMPLATES = Environment(loader=PackageLoader("rag_service.web", "templates"), autoescape=select_autoescape(["html"]),
                        undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
TEMPLATES.filters.update(number=_number, percent=_percent, age=_age, when=_when, collection=collection_name)


def render(request: Request, template: str, *, status_code: int = 200, error: str | None = None,
           **context: Any) -> HTMLResponse:
    """A page; the signed-in session (if the request has one) drives the navigation."""
    session = getattr(request.state, "console_session", None)
    html = TEMPLATES.get_template(template).render(session=session, error=error, path=request.url.path, **context)
    return HTMLResponse(html, status_code=status_code, headers=_HEADERS)


def redirect(url: str) -> RedirectResponse:
    """After a POST: 303, so the browser follows with a GET and a reload does not resend the form."""
    return RedirectResponse(url, status_code=303, headers=_HEADERS)


def error_page(request: Request, exc: RagServiceError) -> HTMLResponse:
    return render(request, "error.html", status_code=exc.status_code, error=exc.message, title=exc.title)


def invalid(exc: ValidationError | RequestValidationError) -> InvalidInputError:
    """A form's validation errors as one message a person can act on."""
    problems = []
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"] if p not in ("body", "query", "path"))
        message = str(err["msg"]).removeprefix("Value error, ")
        problems.append(f"{field}: {message}" if field else message)
    return InvalidInputError("; ".join(problems) or "invalid input")


class ConsolePage(APIRoute):
    """Console routes answer in HTML: no session is a redirect to the sign-in page, a service error
    (or a malformed form or path) a page with the message and the error's status."""

    def get_route_handler(self) -> Callable[[Request], Awaitable[Response]]:
        handle = super().get_route_handler()

        async def page(request: Request) -> Response:
            try:
                return await handle(request)
            except SignInRequired:
                return redirect(SIGN_IN)
            except RagServiceError as exc:
                return error_page(request, exc)
            except RequestValidationError as exc:
                return error_page(request, invalid(exc))

        return page
