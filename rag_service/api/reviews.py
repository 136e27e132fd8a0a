"""The human-review queue (reviewers) and the answers' read side with user feedback (readers):
GET /v1/reviews, GET /v1/reviews/stats, GET /v1/reviews/{id}, POST /v1/reviews/{id}/claim,
POST /v1/reviews/{id}/decision, GET /v1/answers/{id}, POST /v1/answers/{id}/feedback."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query

from rag_service.api.auth import ReaderDep, ReviewerDep, role, scoped_collection
from rag_service.api.deps import RuntimeDep
from rag_service.domain import MetricName, ReviewStatus
from rag_service.domain.review import (
    AnswerView,
    FeedbackReceipt,
    FeedbackRequest,
    ReviewClaim,
    ReviewDecisionPublic,
    ReviewDecisionRequest,
    ReviewFilters,
    ReviewItemDetail,
    ReviewItemsPage,
    ReviewStats,
)

router = APIRouter(prefix="/v1")

_NOT_FOUND = {404: {"description": "No such item, or outside the key's collections"}}
_CONFLICT = {409: {"description": "Another reviewer holds a live claim (the body names `claimed_by` and "
                                  "`lease_expires_at`), or the item is already decided"}}


@router.get("/reviews", response_model=ReviewItemsPage, tags=["reviews"], summary="The review queue",
            description="Items in queue order: tier `high` first, then by priority (lower overall score, more "
                        "traffic on the same question, older), then oldest first. Lapsed claims return to "
                        "`pending` and items pending longer than RAGSVC_REVIEW_EXPIRE_AFTER_DAYS become `expired` "
                        "before the page is read.",
            **role("reviewer"))
async def list_reviews(
    runtime: RuntimeDep, caller: ReviewerDep,
    status: Annotated[ReviewStatus | None, Query(description="Only items in this state.")] = None,
    reason: Annotated[str | None, Query(min_length=1, max_length=200,
                                        description="A substring of a reason (case-insensitive).")] = None,
    metric: Annotated[MetricName | None, Query(description="Only items that flagged this metric.")] = None,
    prompt_name: Annotated[str | None, Query(max_length=200)] = None,
    prompt_version: Annotated[int | None, Query(ge=1)] = None,
    collection: Annotated[str | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> ReviewItemsPage:
    if collection is not None:
        collection = scoped_collection(caller, collection)
    filters = ReviewFilters(status=status, reason=reason, metric=metric, prompt_name=prompt_name,
                            prompt_version=prompt_version, collection=collection)
    return await runtime.reviews.list(caller, filters, limit=limit, offset=offset)


@router.get("/reviews/stats", response_model=ReviewStats, tags=["reviews"], summary="The queue's statistics",
            description="Queue length by state, p50/p95 of how long open items have waited, decisions by category "
                        "and by prompt version, and per metric the agreement (Cohen's kappa) between the scorer "
                        "flagging it and the reviewer rejecting or editing the answer.",
            **role("reviewer"))
async def review_stats(runtime: RuntimeDep, caller: ReviewerDep) -> ReviewStats:
    return await runtime.reviews.stats(caller)


@router.get("/reviews/{review_id}", response_model=ReviewItemDetail, tags=["reviews"], summary="One review item",
            description="The question, the answer with its citations (quoted spans and offsets), the passages the "
                        "generator read, the route and intent, every scorer's grades with reasons, and the decision "
                        "once made.",
            responses=_NOT_FOUND, **role("reviewer"))
async def get_review(review_id: uuid.UUID, runtime: RuntimeDep, caller: ReviewerDep) -> ReviewItemDetail:
    return await runtime.reviews.get(caller, review_id)


@router.post("/reviews/{review_id}/claim", response_model=ReviewClaim, tags=["reviews"], summary="Claim an item",
             description="A lease of RAGSVC_REVIEW_LEASE_S seconds: nobody else can claim or decide the item until "
                         "it expires. Claiming again extends your own lease.",
             responses={**_NOT_FOUND, **_CONFLICT}, **role("reviewer"))
async def claim_review(review_id: uuid.UUID, runtime: RuntimeDep, caller: ReviewerDep) -> ReviewClaim:
    return await runtime.reviews.claim(caller, review_id)


@router.post("/reviews/{review_id}/decision", response_model=ReviewDecisionPublic, status_code=201,
             tags=["reviews"], summary="Decide a claimed item",
             description="Needs your live claim (else 409: claim it first). Approved and edited answers become "
                         "golden items. The decision records your key. A `corrected_prompt` becomes a candidate "
                         "version of the answer's prompt, a `corrected_routing` a candidate guidelines version "
                         "(label `candidate`, linked to this review).",
             responses={**_NOT_FOUND, **_CONFLICT,
                        422: {"description": "Invalid decision (e.g. edited without corrected_answer)"}},
             **role("reviewer"))
async def decide_review(review_id: uuid.UUID, body: ReviewDecisionRequest, runtime: RuntimeDep,
                        caller: ReviewerDep) -> ReviewDecisionPublic:
    return await runtime.learning.decide(caller, review_id, body)


@router.get("/answers/{answer_id}", response_model=AnswerView, tags=["answers"], summary="An answer",
            description="The answer as its caller may see it (the id is the query's `query_id`). A held answer "
                        "(review gate in hold mode) is `pending_review` until a reviewer decides; then `reviewed` "
                        "(approved, or the corrected answer) or `rejected`. Readers see the answers asked with "
                        "their own key; reviewers and admins see all.",
            responses={404: {"description": "No such answer, or not this caller's"}}, **role("reader"))
async def get_answer(answer_id: uuid.UUID, runtime: RuntimeDep, caller: ReaderDep) -> AnswerView:
    return await runtime.reviews.answer(caller, answer_id)


@router.post("/answers/{answer_id}/feedback", response_model=FeedbackReceipt, status_code=201, tags=["answers"],
             summary="Rate an answer",
             description="A rating from 1 to 5 with an optional comment (stored PII-masked). A rating of 2 or less "
                         "queues the answer for review (1: high priority), or adds the reason to its existing item.",
             responses={404: {"description": "No such answer, or not this caller's"},
                        422: {"description": "Rating outside 1-5, or comment too long"}},
             **role("reader"))
async def answer_feedback(answer_id: uuid.UUID, body: FeedbackRequest, runtime: RuntimeDep,
                          caller: ReaderDep) -> FeedbackReceipt:
    return await runtime.reviews.feedback(caller, answer_id, body)
