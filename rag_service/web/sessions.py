"""Who is using the console: the session cookie resolved to a session (or a redirect to sign in),
the CSRF check every form post passes, and the admin-only guard.

The cookie is HttpOnly (no script reads it), SameSite=Strict (another site's form does not send
it) and scoped to /review; Secure when the console is reached over https. Each form also carries
the session's CSRF token, for browsers that ignore SameSite.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from typing import Annotated

from fastapi import Depends, Form, Request, Response

from rag_service.db.repos.sessions import ConsoleSession, ConsoleSessionRepository
from rag_service.domain import DEFAULT_TENANT, Role
from rag_service.errors import ForbiddenError
from rag_service.runtime import Runtime
from rag_service.web.pages import SignInRequired

COOKIE = "ragsvc_console"
COOKIE_PATH = "/review"
CONSOLE_ROLES: tuple[Role, ...] = ("reviewer", "admin")


def runtime(request: Request) -> Runtime:
    return request.app.state.runtime


def sessions(request: Request) -> ConsoleSessionRepository:
    return ConsoleSessionRepository(runtime(request).db)


async def current_session(request: Request) -> ConsoleSession:
    token = request.cookies.get(COOKIE)
    session = await sessions(request).get(token) if token else None
    if session is None:
        raise SignInRequired
    request.state.console_session = session  # for the navigation of every page, error pages too
    return session


SessionDep = Annotated[ConsoleSession, Depends(current_session)]


async def form_session(session: SessionDep, csrf_token: Annotated[str, Form()] = "") -> ConsoleSession:
    """The session of a form post whose CSRF token is the session's."""
    if not secrets.compare_digest(csrf_token.encode(), session.csrf_token.encode()):
        raise ForbiddenError("this form's security token does not match your session (it may be from an older "
                             "sign-in); reload the page and submit it again")
    return session


FormSessionDep = Annotated[ConsoleSession, Depends(form_session)]


async def operator_session(session: SessionDep) -> None:
    """A router dependency for the pages of what every tenant shares (prompts, experiments): the
    default tenant's keys only, as in the API (``api/auth.operator_only``)."""
    if session.caller.tenant != DEFAULT_TENANT:
        raise ForbiddenError("prompts and experiments are shared by every tenant; only keys of the "
                             f"{DEFAULT_TENANT!r} tenant (the operator's) see them")


def require_admin(session: ConsoleSession, what: str) -> None:
    if not session.caller.can("admin"):
        raise ForbiddenError(f"only an admin may {what}; you are signed in with a {session.caller.role} key")


def set_cookie(response: Response, request: Request, token: str, expires_at: datetime) -> None:
    # Starlette formats the expiry as GMT, and wants it in UTC to do so.
    response.set_cookie(COOKIE, token, expires=expires_at.astimezone(UTC), path=COOKIE_PATH, httponly=True,
                        samesite="strict", secure=_https(request))


def clear_cookie(response: Response, request: Request) -> None:
    response.delete_cookie(COOKIE, path=COOKIE_PATH, httponly=True, samesite="strict", secure=_https(request))


def _https(request: Request) -> bool:
    """Reached over https, directly or through a TLS-terminating proxy that says so."""
    forwarded = request.headers.get("x-forwarded-proto", "").split(",")[0].strip().lower()
    return request.url.scheme == "https" or forwarded == "https"
