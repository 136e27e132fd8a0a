"""The review queue and one item: read it, claim it, decide it (with the corrections that become
candidate prompt and guideline versions)."""

from __future__ import annotations

import json
import uuid
from typing import Annotated, Any, get_args
from urllib.parse import urlencode

from fastapi import APIRouter, Form, Query, Request, Response
from fastapi.responses import HTMLResponse
from pydantic import ValidationError

from rag_service.domain import METRICS, REVIEW_STATUSES, DecisionKind, ReviewCategory
from rag_service.domain.review import ReviewDecisionRequest, ReviewFilters, ReviewItemDetail
from rag_service.errors import InvalidInputError, RagServiceError
from rag_service.web.markup import highlighted, linked_answer
from rag_service.web.pages import ConsolePage, invalid, redirect, render
from rag_service.web.sessions import FormSessionDep, SessionDep, runtime

router = APIRouter(route_class=ConsolePage)

DECISIONS: tuple[str, ...] = get_args(DecisionKind)
CATEGORIES: tuple[str, ...] = get_args(ReviewCategory)
PAGE_SIZES = (25, 50, 100)
Text = Annotated[str, Form(max_length=50_000)]


def _blank(value: str) -> str | None:
    return value.strip() or None


@router.get("")
async def queue(request: Request, session: SessionDep, status: str = "", metric: str = "", reason: str = "",
                limit: Annotated[int, Query(ge=1, le=200)] = 50,
                offset: Annotated[int, Query(ge=0)] = 0) -> HTMLResponse:
    try:
        filters = ReviewFilters(status=_blank(status), metric=_blank(metric), reason=_blank(reason))
    except ValidationError as exc:
        raise invalid(exc) from exc
    page = await runtime(request).reviews.list(session.caller, filters, limit=limit, offset=offset)
    shown = {k: v for k, v in (("status", status), ("metric", metric), ("reason", reason)) if v}

    def at(new_offset: int) -> str:
        return "/review?" + urlencode({**shown, "limit": limit, "offset": new_offset})

    return render(request, "queue.html", title="Review queue", page=page, filters=shown, limit=limit,
                  offset=offset, statuses=REVIEW_STATUSES, metrics=METRICS, page_sizes=PAGE_SIZES,
                  previous=at(max(0, offset - limit)) if offset > 0 else None,
                  next=at(offset + limit) if offset + limit < page.count else None)


def _item_page(request: Request, item: ReviewItemDetail, *, status_code: int = 200, error: str | None = None,
               form: dict[str, str] | None = None, flash: list[str] | None = None,
               candidates: dict[str, int] | None = None) -> HTMLResponse:
    passages = {chunk.n for chunk in item.context}
    chunks = [(chunk, highlighted(chunk.text, [c.quote for c in item.citations if c.n == chunk.n])
               if chunk.text is not None else None) for chunk in item.context]
    return render(request, "item.html", title=f"Review: {item.question[:60]}", status_code=status_code,
                  error=error, item=item, answer=linked_answer(item.answer.text, passages), chunks=chunks,
                  decisions=DECISIONS, categories=CATEGORIES, form=form or {"decision": "", "category": ""},
                  flash=flash or [], candidates=candidates or {})


@router.get("/items/{review_id}")
async def item(request: Request, review_id: uuid.UUID, session: SessionDep, claimed: int = 0, done: int = 0,
               candidate_prompt: int | None = None, candidate_guidelines: int | None = None) -> HTMLResponse:
    detail = await runtime(request).reviews.get(session.caller, review_id)
    flash = []
    if claimed and detail.lease_expires_at is not None:
        flash.append(f"You claimed this item until {detail.lease_expires_at:%H:%M:%S UTC}.")
    if done and detail.decision is not None:
        flash.append(f"Decision recorded: {detail.decision.decision} ({detail.decision.category}).")
    candidates = {kind: number for kind, number in (("prompt", candidate_prompt), ("guidelines", candidate_guidelines))
                  if number is not None}
    return _item_page(request, detail, flash=flash, candidates=candidates)


@router.post("/items/{review_id}/claim")
async def claim(request: Request, review_id: uuid.UUID, session: FormSessionDep) -> Response:
    reviews = runtime(request).reviews
    try:
        await reviews.claim(session.caller, review_id)
    except RagServiceError as exc:  # e.g. another reviewer holds it: show the item with why
        return _item_page(request, await reviews.get(session.caller, review_id), status_code=exc.status_code,
                          error=exc.message)
    return redirect(f"/review/items/{review_id}?claimed=1")


def _decision(form: dict[str, str]) -> ReviewDecisionRequest:
    routing: Any = None
    if _blank(form["corrected_routing"]):
        try:
            routing = json.loads(form["corrected_routing"])
        except json.JSONDecodeError as exc:
            raise InvalidInputError(f"corrected routing is not valid JSON: {exc.msg} (line {exc.lineno}, "
                                    f"column {exc.colno}); e.g. {{\"guideline\": \"exact-lookup\"}}") from exc
        if not isinstance(routing, dict):
            raise InvalidInputError('corrected routing must be a JSON object, e.g. {"guideline": "exact-lookup"}')
    prompt = _blank(form["corrected_prompt"])  # checked by the service before anything is stored
    try:
        return ReviewDecisionRequest(
            decision=form["decision"], category=form["category"], feedback=_blank(form["feedback"]),
            corrected_answer=_blank(form["corrected_answer"]), corrected_prompt=prompt,
            corrected_routing=routing)
    except ValidationError as exc:
        raise invalid(exc) from exc


@router.post("/items/{review_id}/decision")
async def decide(request: Request, review_id: uuid.UUID, session: FormSessionDep, decision: Text = "",
                 category: Text = "", feedback: Text = "", corrected_answer: Text = "", corrected_prompt: Text = "",
                 corrected_routing: Text = "") -> Response:
    form = {"decision": decision, "category": category, "feedback": feedback, "corrected_answer": corrected_answer,
            "corrected_prompt": corrected_prompt, "corrected_routing": corrected_routing}
    rt = runtime(request)
    try:
        result = await rt.learning.decide(session.caller, review_id, _decision(form))
    except RagServiceError as exc:  # the form comes back with what was typed, and why it was refused
        return _item_page(request, await rt.reviews.get(session.caller, review_id), status_code=exc.status_code,
                          error=exc.message, form=form)
    query: dict[str, int] = {"done": 1}
    if result.candidate_prompt_version is not None:
        query["candidate_prompt"] = result.candidate_prompt_version
    if result.candidate_guidelines_version is not None:
        query["candidate_guidelines"] = result.candidate_guidelines_version
    return redirect(f"/review/items/{review_id}?{urlencode(query)}")
