"""The human-review queue: items (at most one per answer), claims with leases, decisions, golden
items, feedback and the queue's statistics."""

from __future__ import annotations

import uuid

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from rag_service.domain import ReviewTrigger


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
        "overall = COALESCE(EXCLUDED.overall, review_items.overall), updated_at = now() "
        "RETURNING id"),
        {"id": item_id or uuid.uuid4(), "query_id": query_id, "collection": collection, "question_hash": question_hash,
         "trigger": trigger.source, "tier": trigger.tier, "reasons": list(trigger.reasons),
         "metrics": list(trigger.flagged), "overall": trigger.overall, "prompt_name": prompt_name,
         "prompt_version": prompt_version, "held": trigger.held})).one()
    return row.id
