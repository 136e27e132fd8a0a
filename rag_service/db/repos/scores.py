"""An answer's grades (``answer_scores``: one row per answer and scorer), written with the answer
or later by the LLM judge, and read back for reviewers and the answers API."""

from __future__ import annotations

import uuid

from sqlalchemy import text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.expression import bindparam

from rag_service.domain import EvaluationReport
from rag_service.domain.review import StoredScores

# One row of answer_scores (bind :metrics as JSONB), its query id taken from ``{query_id}``.
SCORE_ROW = ("INSERT INTO answer_scores (query_id, scorer, metrics, overall, needs_review, reasons) "
             "SELECT {query_id}, :scorer, :metrics, :overall, :needs_review, CAST(:reasons AS text[])")


def score_params(scorer: str, report: EvaluationReport) -> dict[str, object]:
    """``SCORE_ROW``'s parameters for ``report``."""
    return {"scorer": scorer, "metrics": report.model_dump(mode="json")["metrics"], "overall": report.overall,
            "needs_review": report.needs_review, "reasons": report.reasons}


async def save_scores(conn: AsyncConnection, query_id: uuid.UUID, scorer: str, report: EvaluationReport) -> None:
    """One row per answer and scorer; a later grading by the same scorer replaces it."""
    await conn.execute(text(
        SCORE_ROW.format(query_id=":qid") + " ON CONFLICT (query_id, scorer) DO UPDATE SET "
        "metrics = EXCLUDED.metrics, overall = EXCLUDED.overall, needs_review = EXCLUDED.needs_review, "
        "reasons = EXCLUDED.reasons, created_at = now()").bindparams(
            bindparam("metrics", type_=JSONB)),
        {"qid": query_id, **score_params(scorer, report)})


async def stored_scores(conn: AsyncConnection, query_id: uuid.UUID) -> list[StoredScores]:
    """Every scorer's grades of the answer, oldest first."""
    rows = (await conn.execute(text(
        "SELECT scorer, overall, needs_review, reasons, metrics, created_at FROM answer_scores "
        "WHERE query_id = :qid ORDER BY created_at, scorer"), {"qid": query_id})).all()
    return [StoredScores.model_validate(dict(r._mapping)) for r in rows]
