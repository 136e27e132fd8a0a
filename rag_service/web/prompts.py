"""Prompts and the router's guidelines: their labels, one prompt's versions and label audit, and
rolling production back (admins)."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Form, Path, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from rag_service.domain.prompts import PRODUCTION, PromptKind
from rag_service.web.pages import ConsolePage, redirect, render
from rag_service.web.sessions import FormSessionDep, SessionDep, operator_session, require_admin, runtime

router = APIRouter(route_class=ConsolePage, dependencies=[Depends(operator_session)])

Name = Annotated[str, Path(min_length=1, max_length=200, pattern=r"^[a-z0-9_]+$")]


@router.get("/prompts")
async def prompts(request: Request, session: SessionDep, name: Annotated[str | None, Query(max_length=200)] = None,
                  kind: PromptKind = "prompt", rolled_back: int | None = None) -> HTMLResponse:
    repository = runtime(request).prompt_repository
    summaries = await repository.summaries()
    versions, moves = [], []
    if name:
        versions, _ = await repository.versions(kind, name, limit=200)
        moves = await repository.moves(kind, name, limit=200)
    return render(request, "prompts.html", title=f"Prompt {name}" if name else "Prompts", summaries=summaries,
                  name=name, kind=kind, versions=versions, moves=moves, rolled_back=rolled_back,
                  production=PRODUCTION)


@router.post("/prompts/{name}/rollback")
async def rollback(request: Request, name: Name, session: FormSessionDep,
                   reason: Annotated[str, Form(max_length=2_000)] = "") -> RedirectResponse:
    require_admin(session, "roll production back")
    move = await runtime(request).prompts.rollback(session.caller, "prompt", name, PRODUCTION, reason.strip() or None)
    return redirect("/review/prompts?" + urlencode({"name": name, "rolled_back": move.to_version}))
