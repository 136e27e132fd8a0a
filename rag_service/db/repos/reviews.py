"""The human-review queue: items (at most one per answer), claims with leases, decisions, golden
items and the queue's statistics. (Answers as their askers see them, with feedback: answers.py.)"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.expression import bindparam

from rag_service.db.engine import Database
from rag_service.db.repos.review_scope import ReviewScope, scope_sql
from rag_service.db.repos.scores import stored_scores
from rag_service.db.tenancy import in_scope_sql
from rag_service.domain import ReviewTrigger, TenantScope
from rag_service.domain.review import (
    PriorityPolicy,
    RetrievedChunk,
    ReviewClaim,
    ReviewDecisionPublic,
    ReviewDecisionRequest,
    ReviewFilters,
    ReviewItemDetail,
    ReviewItemSummary,
)
from rag_service.errors import ConflictError, NotFoundError


async def enqueue(conn: AsyncConnection, *, query_id: uuid.UUID, collection: str, question_hash: str | None,
                  trigger: ReviewTrigger, prompt_name: str | None = None,
                  prompt_version: int | None = None, item_id: uuid.UUID | None = None) -> uuid.UUID:
    """Queue the answer (inside the caller's transaction) and return its item's id. Idempotent:
    a second trigger for the same answer adds its reasons to the one item, raises its tier if
    higher, and never creates another row (the unique constraint on query_id guarantees it even
    under concurrent triggers)."""
    row = (await conn.execute(text(
        "INSERT INTO review_items (id, query_id, collection, question_hash, trigger, tier, reasons, metrics, "
        "overall, prompt_name, prompt_version, held) VALUES (:id, :query_id, :collection, :question_hash, "
        ":trigger, :tier, CAST(:reasons AS text[]), CAST(:metrics AS text[]), :overall, :prompt_name, "
        ":prompt_version, :held) "
        "ON CONFLICT (query_id) DO UPDATE SET "
        "reasons = ARRAY(SELECT DISTINCT unnest(review_items.reasons || EXCLUDED.reasons) ORDER BY 1), "
        "metrics = ARRAY(SELECT DISTINCT unnest(review_items.metrics || EXCLUDED.metrics) ORDER BY 1), "
        "tier = CASE WHEN EXCLUDED.tier = 'high' THEN 'high' ELSE review_items.tier END, "
        "trigger = CASE WHEN position(EXCLUDED.trigger IN review_items.trigger) > 0 THEN review_items.trigger "
        "ELSE review_items.trigger || '+' || EXCLUDED.trigger END, "
        "overall = COALESCE(EXCLUDED.overall, review_items.overall), updated_at = now(), "
        # A user flagging an answer whose review expired unreviewed puts it back in the queue.
        "status = CASE WHEN review_items.status = 'expired' THEN 'pending' ELSE review_items.status END, "
        "created_at = CASE WHEN review_items.status = 'expired' THEN now() ELSE review_items.created_at END "
        "RETURNING id"),
        {"id": item_id or uuid.uuid4(), "query_id": query_id, "collection": collection, "question_hash": question_hash,
         # Distinct and sorted, as the conflict branch leaves them: the first trigger and later
         # ones give the same row.
         "trigger": trigger.source, "tier": trigger.tier, "reasons": sorted(set(trigger.reasons)),
         "metrics": sorted(set(trigger.flagged)), "overall": trigger.overall, "prompt_name": prompt_name,
         "prompt_version": prompt_version, "held": trigger.held})).one()
    return row.id


# The queue's order, mirroring rag_service.review.priority (tests/review/test_priority.py checks
# that they agree). ``s`` is a lateral row with the item's traffic and age; every weight is bound
# from a PriorityPolicy.
_TRAFFIC = ("(SELECT count(*) FROM queries t WHERE t.question_hash = r.question_hash AND t.collection = r.collection "
            "AND t.created_at > now() - make_interval(secs => CAST(:traffic_window_s AS float8)))")
_AGE = "GREATEST(CAST(extract(epoch FROM now() - r.created_at) AS float8), 0)"
_PRIORITY = ("(CAST(:score_weight AS float8) * (1 - COALESCE(r.overall, 0)) "
             "+ CAST(:traffic_weight AS float8) * LEAST(ln(1 + CAST(s.traffic AS float8)) "
             "/ ln(1 + CAST(:traffic_cap AS float8)), 1) "
             "+ CAST(:age_weight AS float8) * LEAST(s.age_s / CAST(:age_horizon_s AS float8), 1))")
_FROM = (f"FROM review_items r JOIN queries q ON q.id = r.query_id "
         f"CROSS JOIN LATERAL (SELECT {_TRAFFIC} AS traffic, {_AGE} AS age_s) s")
_ORDER = "ORDER BY (r.tier = 'high') DESC, priority DESC, r.created_at, r.id"
_SUMMARY = ("r.id, r.query_id AS answer_id, r.collection, r.status, r.tier, r.trigger, r.reasons, r.metrics, "
            "r.overall, r.prompt_name, r.prompt_version, r.held, q.question, s.traffic, s.age_s, "
            f"{_PRIORITY} AS priority, r.claimed_by, r.claimed_at, r.lease_expires_at, r.created_at, r.decided_at")
# An item still waiting: pending, or claimed by a lease that has run out.
_CLAIMABLE = "(r.status = 'pending' OR (r.status = 'claimed' AND r.lease_expires_at <= now()))"
DECIDED: frozenset[str] = frozenset({"approved", "rejected", "edited"})


@dataclass(frozen=True)
class StatsInputs:
    """The raw numbers ``rag_service.review.stats`` summarises."""

    by_status: dict[str, int]
    open_ages_s: list[float]
    # (decision, category, prompt_name, prompt_version, count)
    decisions: list[tuple[str, str, str | None, int | None, int]]
    # (flagged metrics, decision) of every decided item
    decided: list[tuple[tuple[str, ...], str]]


@dataclass(frozen=True)
class Housekeeping:
    """What one upkeep run changed: lapsed claims put back to pending, old pending items expired."""

    released: int
    expired: int


def _like(fragment: str) -> str:
    escaped = fragment.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def _holder(claimed_by: uuid.UUID | None) -> str:
    return "the local operator" if claimed_by is None else f"reviewer key {claimed_by}"


class ReviewRepository:
    """The review queue's SQL. Reviewers are identified by their API key id (None: the local
    operator, e.g. ``ragsvc review``); ``scope`` limits every method to those collections (None:
    all), and an item outside it is reported as not found."""

    def __init__(self, db: Database, policy: PriorityPolicy | None = None) -> None:
        self._db = db
        self.policy = policy or PriorityPolicy()

    @property
    def db(self) -> Database:
        return self._db

    def _priority_params(self) -> dict[str, Any]:
        return self.policy.model_dump()

    # --- listing ---------------------------------------------------------------------------------

    async def list(self, filters: ReviewFilters | None = None, *, limit: int = 50, offset: int = 0,
                   scope: ReviewScope | None = None) -> tuple[list[ReviewItemSummary], int]:
        """A page of the queue in priority order, and how many items match in all."""
        params: dict[str, Any] = {**self._priority_params(), "limit": limit, "offset": offset}
        where = self._where(filters or ReviewFilters(), params, scope)
        async with self._db.connect() as conn:
            rows = (await conn.execute(text(
                f"SELECT {_SUMMARY} {_FROM} WHERE {where} {_ORDER} LIMIT :limit OFFSET :offset"), params)).all()
            total = (await conn.execute(text(
                f"SELECT count(*) FROM review_items r WHERE {where}"), params)).scalar_one()
        return [ReviewItemSummary.model_validate(dict(r._mapping)) for r in rows], total

    @staticmethod
    def _where(filters: ReviewFilters, params: dict[str, Any], scope: ReviewScope | None) -> str:
        conditions = [scope_sql(scope, params)]
        if filters.status is not None:
            conditions.append("r.status = :status")
            params["status"] = filters.status
        if filters.reason is not None:
            conditions.append("EXISTS (SELECT 1 FROM unnest(r.reasons) AS x(reason) "
                              "WHERE x.reason ILIKE :reason ESCAPE '\\')")
            params["reason"] = _like(filters.reason)
        if filters.metric is not None:
            conditions.append(":metric = ANY(r.metrics)")
            params["metric"] = filters.metric
        for column in ("prompt_name", "prompt_version", "collection"):
            value = getattr(filters, column)
            if value is not None:
                conditions.append(f"r.{column} = :{column}")
                params[column] = value
        return " AND ".join(conditions)

    async def get(self, review_id: uuid.UUID, scope: ReviewScope | None = None) -> ReviewItemDetail:
        """The item with its question, answer, citations, the passages read, route, intent, scores
        and decision."""
        params: dict[str, Any] = {**self._priority_params(), "id": review_id}
        where = scope_sql(scope, params)
        async with self._db.connect() as conn:
            row = (await conn.execute(text(
                f"SELECT {_SUMMARY}, q.resolved_question, q.intent, q.route, a.text AS answer_text, "
                "a.short_answer, a.generator, a.model, a.confidence, a.citations, a.context "
                f"{_FROM} JOIN answers a ON a.query_id = r.query_id WHERE r.id = :id AND {where}"), params)).first()
            if row is None:
                raise NotFoundError(f"no review item {review_id}")
            context = await self._context(conn, row.context)
            scores = await stored_scores(conn, row.answer_id)
            decision = await self._decision(conn, review_id)
        data = dict(row._mapping)
        return ReviewItemDetail.model_validate({
            **data, "context": context, "scores": scores, "decision": decision,
            "answer": {"text": row.answer_text, "short_answer": row.short_answer, "generator": row.generator,
                       "model": row.model, "confidence": row.confidence},
        })

    @staticmethod
    async def _context(conn: AsyncConnection, context: list[dict[str, Any]]) -> list[RetrievedChunk]:
        ids = [uuid.UUID(str(c["chunk_id"])) for c in context if c.get("chunk_id")]
        found = {}
        if ids:
            found = {r.id: r for r in (await conn.execute(text(
                "SELECT c.id, c.text, c.document_id, d.source_uri, d.title FROM chunks c "
                "JOIN documents d ON d.id = c.document_id WHERE c.id = ANY(CAST(:ids AS uuid[]))"),
                {"ids": ids})).all()}
        chunks = []
        for entry in sorted(context, key=lambda c: c.get("n", 0)):
            if not entry.get("chunk_id"):
                continue
            chunk_id = uuid.UUID(str(entry["chunk_id"]))
            hit = found.get(chunk_id)
            chunks.append(RetrievedChunk(
                n=entry.get("n", 0), chunk_id=chunk_id, score=entry.get("score"),
                text=hit.text if hit else None, document_id=hit.document_id if hit else None,
                source_uri=hit.source_uri if hit else None, title=hit.title if hit else None))
        return chunks

    @staticmethod
    async def _decision(conn: AsyncConnection, review_id: uuid.UUID) -> ReviewDecisionPublic | None:
        row = (await conn.execute(text(
            "SELECT d.review_id, d.decision, d.category, d.feedback, d.corrected_answer, d.corrected_routing, "
            "d.corrected_prompt, d.time_to_review_s, d.reviewer_key_id, d.prompt_name, d.prompt_version, "
            "d.created_at, g.id AS golden_item_id FROM review_decisions d "
            "LEFT JOIN golden_items g ON g.review_id = d.review_id WHERE d.review_id = :id"),
            {"id": review_id})).first()
        return None if row is None else ReviewDecisionPublic.model_validate(dict(row._mapping))

    # --- claims ----------------------------------------------------------------------------------

    async def claim(self, review_id: uuid.UUID, reviewer: uuid.UUID | None, lease_s: float,
                    scope: ReviewScope | None = None) -> ReviewClaim:
        """Lease the item to ``reviewer`` for ``lease_s`` seconds. The same reviewer claiming
        again extends the lease; a lapsed lease can be taken by anyone; a live one held by someone
        else is a ConflictError naming the holder and the expiry. Decided items cannot be claimed;
        expired ones can (a reviewer may still look at them)."""
        params: dict[str, Any] = {"id": review_id}
        where = scope_sql(scope, params)
        async with self._db.begin() as conn:
            # SKIP LOCKED: a concurrent claim holds the row lock until it commits; waiting for
            # it would only end in a conflict anyway.
            row = (await conn.execute(text(
                "SELECT r.id, r.status, r.claimed_by, r.lease_expires_at, r.lease_expires_at > now() AS live "
                f"FROM review_items r WHERE r.id = :id AND {where} FOR UPDATE SKIP LOCKED"), params)).first()
            if row is None:
                exists = (await conn.execute(text(
                    f"SELECT 1 FROM review_items r WHERE r.id = :id AND {where}"), params)).first()
                if exists is None:
                    raise NotFoundError(f"no review item {review_id}")
                raise ConflictError(f"review item {review_id} is being claimed by another reviewer right now",
                                    fields={"review_id": str(review_id)})
            if row.status in DECIDED:
                raise ConflictError(f"review item {review_id} is already decided ({row.status})",
                                    fields={"review_id": str(review_id), "review_status": row.status})
            held_live = row.status == "claimed" and row.live
            if held_live and row.claimed_by != reviewer:
                raise self._held_elsewhere(review_id, row.claimed_by, row.lease_expires_at)
            # The same reviewer extends the lease and keeps its start (time to review counts from it).
            claimed_at = "r.claimed_at" if held_live else "now()"
            claimed = (await conn.execute(text(
                f"UPDATE review_items r SET status = 'claimed', claimed_by = :reviewer, claimed_at = {claimed_at}, "
                "lease_expires_at = now() + make_interval(secs => CAST(:lease_s AS float8)), updated_at = now() "
                "WHERE r.id = :id RETURNING r.id AS review_id, r.claimed_by, r.claimed_at, r.lease_expires_at"),
                {"id": review_id, "reviewer": reviewer, "lease_s": lease_s})).one()
        return ReviewClaim.model_validate(dict(claimed._mapping))

    async def claim_next(self, reviewer: uuid.UUID | None, lease_s: float, filters: ReviewFilters | None = None,
                         scope: ReviewScope | None = None) -> ReviewClaim | None:
        """Claim the highest-priority item nobody holds (None: nothing to claim). Concurrent
        callers each get a different item (SKIP LOCKED)."""
        filters = (filters or ReviewFilters()).model_copy(update={"status": None})
        params: dict[str, Any] = {**self._priority_params(), "reviewer": reviewer, "lease_s": lease_s}
        where = self._where(filters, params, scope)
        async with self._db.begin() as conn:
            row = (await conn.execute(text(
                f"SELECT r.id, {_PRIORITY} AS priority {_FROM} WHERE {_CLAIMABLE} AND {where} {_ORDER} "
                "LIMIT 1 FOR UPDATE OF r SKIP LOCKED"), params)).first()
            if row is None:
                return None
            claimed = (await conn.execute(text(
                "UPDATE review_items SET status = 'claimed', claimed_by = :reviewer, claimed_at = now(), "
                "lease_expires_at = now() + make_interval(secs => CAST(:lease_s AS float8)), updated_at = now() "
                "WHERE id = :id RETURNING id AS review_id, claimed_by, claimed_at, lease_expires_at"),
                {"id": row.id, "reviewer": reviewer, "lease_s": lease_s})).one()
        return ReviewClaim.model_validate(dict(claimed._mapping))

    @staticmethod
    def _held_elsewhere(review_id: uuid.UUID, claimed_by: uuid.UUID | None, until: datetime) -> ConflictError:
        return ConflictError(
            f"review item {review_id} is claimed by {_holder(claimed_by)} until {until.isoformat()}",
            fields={"review_id": str(review_id), "claimed_by": None if claimed_by is None else str(claimed_by),
                    "lease_expires_at": until.isoformat()})

    # --- decisions ---------------------------------------------------------------------------------

    async def decide(self, review_id: uuid.UUID, reviewer: uuid.UUID | None, request: ReviewDecisionRequest,
                     scope: ReviewScope | None = None) -> ReviewDecisionPublic:
        """Record the decision of the reviewer holding a live claim on the item (anyone else: a
        ConflictError saying to claim it first). Approved and edited answers become golden
        items: the logged question (resolved, if it was a follow-up), the approved or corrected
        answer, the answer's citations."""
        params: dict[str, Any] = {"id": review_id}
        where = scope_sql(scope, params)
        async with self._db.begin() as conn:
            row = (await conn.execute(text(
                "SELECT r.status, r.claimed_by, r.lease_expires_at, r.lease_expires_at > now() AS live, "
                "r.prompt_name, r.prompt_version, "
                "CAST(extract(epoch FROM now() - r.claimed_at) AS float8) AS since_claim "
                f"FROM review_items r WHERE r.id = :id AND {where} FOR UPDATE"), params)).first()
            if row is None:
                raise NotFoundError(f"no review item {review_id}")
            if row.status in DECIDED:
                raise ConflictError(f"review item {review_id} is already decided ({row.status})",
                                    fields={"review_id": str(review_id), "review_status": row.status})
            if row.status != "claimed" or not row.live:
                raise ConflictError(
                    f"claim review item {review_id} before deciding it (POST /v1/reviews/{review_id}/claim, "
                    f"or `ragsvc review claim {review_id}`)", fields={"review_id": str(review_id)})
            if row.claimed_by != reviewer:
                raise self._held_elsewhere(review_id, row.claimed_by, row.lease_expires_at)
            time_to_review = request.time_to_review_s if request.time_to_review_s is not None else row.since_claim
            await conn.execute(text(
                "INSERT INTO review_decisions (review_id, reviewer_key_id, decision, category, feedback, "
                "corrected_answer, corrected_routing, corrected_prompt, time_to_review_s, prompt_name, prompt_version) "
                "VALUES (:id, :reviewer, :decision, :category, :feedback, :corrected_answer, :corrected_routing, "
                ":corrected_prompt, :time_to_review_s, :prompt_name, :prompt_version)").bindparams(
                    bindparam("corrected_routing", type_=JSONB)),
                {"id": review_id, "reviewer": reviewer, "decision": request.decision, "category": request.category,
                 "feedback": request.feedback, "corrected_answer": request.corrected_answer,
                 "corrected_routing": request.corrected_routing, "corrected_prompt": request.corrected_prompt,
                 "time_to_review_s": time_to_review, "prompt_name": row.prompt_name,
                 "prompt_version": row.prompt_version})
            await conn.execute(text(
                "UPDATE review_items SET status = :decision, decided_at = now(), lease_expires_at = NULL, "
                "updated_at = now() WHERE id = :id"), {"id": review_id, "decision": request.decision})
            if request.decision in ("approved", "edited"):
                await conn.execute(text(
                    "INSERT INTO golden_items (id, review_id, collection, question, answer, citations, source) "
                    "SELECT :gid, r.id, r.collection, COALESCE(q.resolved_question, q.question), "
                    "COALESCE(:corrected_answer, a.text), a.citations, :decision FROM review_items r "
                    "JOIN queries q ON q.id = r.query_id JOIN answers a ON a.query_id = r.query_id WHERE r.id = :id"),
                    {"gid": uuid.uuid4(), "id": review_id, "corrected_answer": request.corrected_answer,
                     "decision": request.decision})
            decision = await self._decision(conn, review_id)
        assert decision is not None  # written above, in this transaction
        return decision

    async def reviewed_examples(self, prompt_name: str, *, limit: int = 20,
                                scope: TenantScope | None = None) -> list[dict[str, Any]]:
        """The last ``limit`` approved or edited reviews of answers made with ``prompt_name`` in
        ``scope`` (None: every tenant's), newest first: review id, the question (resolved), the
        approved or corrected answer and the reviewer's feedback text."""
        params: dict[str, Any] = {"name": prompt_name, "limit": limit}
        visible = in_scope_sql("r.collection", scope, params)
        async with self._db.connect() as conn:
            rows = (await conn.execute(text(
                "SELECT r.id AS review_id, COALESCE(q.resolved_question, q.question) AS question, "
                "COALESCE(d.corrected_answer, a.text) AS answer, d.feedback FROM review_decisions d "
                "JOIN review_items r ON r.id = d.review_id JOIN queries q ON q.id = r.query_id "
                "JOIN answers a ON a.query_id = r.query_id WHERE d.prompt_name = :name "
                f"AND d.decision IN ('approved', 'edited') AND {visible} ORDER BY d.created_at DESC, d.id DESC "
                "LIMIT :limit"), params)).all()
        return [dict(r._mapping) for r in rows]

    # --- upkeep ------------------------------------------------------------------------------------

    async def housekeep(self, expire_after_s: float) -> Housekeeping:
        """Put lapsed claims back to pending, and mark items pending longer than
        ``expire_after_s`` expired. Rows another transaction holds are left for the next run."""
        async with self._db.begin() as conn:
            released = (await conn.execute(text(
                "UPDATE review_items SET status = 'pending', claimed_by = NULL, claimed_at = NULL, "
                "lease_expires_at = NULL, updated_at = now() WHERE id IN (SELECT id FROM review_items "
                "WHERE status = 'claimed' AND lease_expires_at <= now() FOR UPDATE SKIP LOCKED)"))).rowcount
            expired = (await conn.execute(text(
                "UPDATE review_items SET status = 'expired', updated_at = now() WHERE id IN (SELECT id "
                "FROM review_items WHERE status = 'pending' "
                "AND created_at < now() - make_interval(secs => CAST(:after AS float8)) FOR UPDATE SKIP LOCKED)"),
                {"after": expire_after_s})).rowcount
        return Housekeeping(released=released, expired=expired)

    # --- statistics --------------------------------------------------------------------------------

    async def stats_inputs(self, scope: ReviewScope | None = None) -> StatsInputs:
        params: dict[str, Any] = {}
        where = scope_sql(scope, params)
        async with self._db.connect() as conn:
            by_status = {r.status: r.n for r in (await conn.execute(text(
                f"SELECT r.status, count(*) AS n FROM review_items r WHERE {where} GROUP BY r.status"),
                params)).all()}
            ages = list((await conn.execute(text(
                "SELECT GREATEST(CAST(extract(epoch FROM now() - r.created_at) AS float8), 0) FROM review_items r "
                f"WHERE r.status IN ('pending', 'claimed') AND {where}"), params)).scalars())
            decisions = [(r.decision, r.category, r.prompt_name, r.prompt_version, r.n) for r in (await conn.execute(
                text("SELECT d.decision, d.category, d.prompt_name, d.prompt_version, count(*) AS n "
                     f"FROM review_decisions d JOIN review_items r ON r.id = d.review_id WHERE {where} "
                     "GROUP BY 1, 2, 3, 4 ORDER BY 3 NULLS FIRST, 4 NULLS FIRST, 1, 2"), params)).all()]
            decided = [(tuple(r.metrics), r.decision) for r in (await conn.execute(text(
                "SELECT r.metrics, d.decision FROM review_decisions d JOIN review_items r ON r.id = d.review_id "
                f"WHERE {where}"), params)).all()]
        return StatsInputs(by_status=by_status, open_ages_s=ages, decisions=decisions, decided=decided)
