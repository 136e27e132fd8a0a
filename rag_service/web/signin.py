"""Signing in to the console with an API key (reviewer or admin), and signing out."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse

from rag_service.web.pages import SIGN_IN, ConsolePage, redirect, render
from rag_service.web.sessions import CONSOLE_ROLES, COOKIE, FormSessionDep, clear_cookie, runtime, sessions, set_cookie

router = APIRouter(route_class=ConsolePage)


@router.get("/login")
async def login_form(request: Request) -> HTMLResponse:
    return render(request, "login.html", title="Sign in")


@router.post("/login")
async def login(request: Request,
                api_key: Annotated[str, Form(max_length=500)] = "") -> Response:
    caller = await runtime(request).keys.authenticate(api_key.strip())
    if caller is None or caller.key_id is None:
        return render(request, "login.html", title="Sign in", status_code=401,
                      error="That API key is unknown or revoked. Ask an admin for a key "
                            "(`ragsvc keys create --role reviewer`).")
    if caller.role not in CONSOLE_ROLES:
        return render(request, "login.html", title="Sign in", status_code=403,
                      error=f"This is a {caller.role} key; the review console needs a reviewer or admin key.")
    hours = runtime(request).settings.console_session_hours
    token, expires_at = await sessions(request).open(caller.key_id, caller.role, hours)
    response = redirect("/review")
    set_cookie(response, request, token, expires_at)
    return response


@router.post("/logout")
async def logout(request: Request, session: FormSessionDep) -> RedirectResponse:
    await sessions(request).close(request.cookies.get(COOKIE, ""))
    response = redirect(SIGN_IN)
    clear_cookie(response, request)
    return response
