"""The review queue and the answers' read side, as the API and CLI use them: who may see what,
the feedback policy, upkeep run lazily, and statistics. SQL lives in ``ReviewRepository``.

Every method takes the ``Caller``: a reviewer's key id is the claim holder (None: the local
operator, which is what ``ragsvc review`` acts as), and a key limited to some collections sees
only their items (others are "not found").
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from rag_service.db.repos.answers import AnswerRecord, AnswerRepository
from rag_service.db.repos.reviews import Housekeeping, ReviewRepository, ReviewScope
from rag_service.domain import Caller
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
from rag_service.errors import NotFoundError
from rag_service.review.answers import answer_view
from rag_service.review.feedback import feedback_trigger
from rag_service.review.stats import summarise


class ReviewService:
    def __init__(self, repository: ReviewRepository, *, lease_s: float, expire_after_s: float,
                 answers: AnswerRepository | None = None, mask: Callable[[str], str] = lambda text: text) -> None:
        if lease_s <= 0 or expire_after_s <= 0:
            raise ValueError("lease_s and expire_after_s must be > 0 (RAGSVC_REVIEW_LEASE_S, "
                             "RAGSVC_REVIEW_EXPIRE_AFTER_DAYS)")
        self.repository = repository
        self.answers = answers or AnswerRepository(repository.db)
        self.lease_s = lease_s
        self.expire_after_s = expire_after_s
        # Feedback comments are stored PII-masked, as questions are.
        self._mask = mask

    async def housekeep(self) -> Housekeeping:
        """Release lapsed claims and expire stale items. Runs before listing, claiming the next
        item and statistics; call it from any periodic place as well."""
        return await self.repository.housekeep(self.expire_after_s)

    async def list(self, caller: Caller, filters: ReviewFilters | None = None, *, limit: int = 50,
                   offset: int = 0) -> ReviewItemsPage:
        await self.housekeep()
        items, count = await self.repository.list(filters, limit=limit, offset=offset, scope=_scope(caller))
        return ReviewItemsPage(data=items, count=count)

    async def get(self, caller: Caller, review_id: uuid.UUID) -> ReviewItemDetail:
        return await self.repository.get(review_id, scope=_scope(caller))

    async def claim(self, caller: Caller, review_id: uuid.UUID, lease_s: float | None = None) -> ReviewClaim:
        return await self.repository.claim(review_id, caller.key_id, lease_s or self.lease_s,
                                           scope=_scope(caller))

    async def claim_next(self, caller: Caller, filters: ReviewFilters | None = None,
                         lease_s: float | None = None) -> ReviewClaim | None:
        await self.housekeep()
        return await self.repository.claim_next(caller.key_id, lease_s or self.lease_s, filters,
                                                scope=_scope(caller))

    async def decide(self, caller: Caller, review_id: uuid.UUID,
                     request: ReviewDecisionRequest) -> ReviewDecisionPublic:
        return await self.repository.decide(review_id, caller.key_id, request, scope=_scope(caller))

    async def stats(self, caller: Caller) -> ReviewStats:
        await self.housekeep()
        return summarise(await self.repository.stats_inputs(scope=_scope(caller)))

    async def _answer(self, caller: Caller, answer_id: uuid.UUID) -> AnswerRecord:
        """The answer, if this caller may see it: its collection is in the key's scope, and it
        was asked with the same key, unless the caller reviews (reviewers and admins see every
        answer, the local operator too). Otherwise "not found", so ids reveal nothing."""
        record = await self.answers.answer(answer_id)
        visible = record is not None and caller.scope.covers(record.collection)
        if visible and not (caller.local or caller.can("reviewer")):
            visible = record is not None and record.api_key_id == caller.key_id
        if visible and record is not None and caller.principals is not None:
            # Never more than the key could retrieve itself: the answer quotes what its asker could read.
            visible = set(record.principals) <= set(caller.principals)
        if record is None or not visible:
            raise NotFoundError(f"no answer {answer_id}")
        return record

    async def answer(self, caller: Caller, answer_id: uuid.UUID) -> AnswerView:
        return answer_view(await self._answer(caller, answer_id))

    async def feedback(self, caller: Caller, answer_id: uuid.UUID, request: FeedbackRequest) -> FeedbackReceipt:
        """Store the rating; a low one queues the answer (see ``rag_service.review.feedback``)."""
        record = await self._answer(caller, answer_id)
        comment = self._mask(request.comment) if request.comment is not None else None
        trigger = feedback_trigger(request.rating, comment, overall=record.overall, held=record.held)
        feedback_id, review_id = await self.answers.add_feedback(
            record, rating=request.rating, comment=comment, key_id=caller.key_id, trigger=trigger)
        return FeedbackReceipt(feedback_id=feedback_id, answer_id=answer_id, rating=request.rating,
                               review_id=review_id)


def _scope(caller: Caller) -> ReviewScope:
    return ReviewScope(collections=caller.scope, principals=caller.principals)
