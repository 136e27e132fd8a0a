"""Queries with their answers, and conversation turns (what a follow-up may refer back to)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from sqlalchemy import text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.expression import bindparam

from rag_service.db.engine import Database
from rag_service.db.repos.answers import LOCK_CITED, forget_vanished
from rag_service.db.repos.reviews import enqueue
from rag_service.db.repos.scores import SCORE_ROW, save_scores, score_params
from rag_service.domain import EvaluationReport, QueryLogEntry, ReviewTrigger, Turn


class QueryLog:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def turns(self, conversation_id: str, collection: str, principals: Sequence[str],
                    limit: int = 5) -> list[Turn]:
        """The conversation's last turns, oldest first; none when the conversation belongs to
        another collection or caller."""
        async with self._db.connect() as conn:
            rows = (await conn.execute(text(
                "SELECT t.question, t.subject FROM conversation_turns t JOIN conversations c "
                "ON c.id = t.conversation_id WHERE t.conversation_id = :cid AND c.collection = :collection "
                "AND c.principals = CAST(:principals AS text[]) ORDER BY t.id DESC LIMIT :limit"),
                {"cid": conversation_id, "collection": collection, "principals": sorted(set(principals)),
                 "limit": limit})).all()
        return [Turn(question=r.question, subject=r.subject) for r in reversed(rows)]

    async def record(self, entry: QueryLogEntry) -> None:
        """One transaction: the query, its answer (if any) and the conversation turn (only in a
        conversation this collection and caller own)."""
        async with self._db.begin() as conn:
            await write_entry(conn, entry)

    async def record_grades(self, query_id: uuid.UUID, *, collection: str, question_hash: str | None,
                            report: EvaluationReport, trigger: ReviewTrigger | None, prompt_name: str | None,
                            prompt_version: int | None) -> None:
        """Grades that came after the answer (the LLM judge's, combined with the local ones), in
        one transaction with the review item they may ask for."""
        async with self._db.begin() as conn:
            await save_scores(conn, query_id, "combined", report)
            if trigger is not None:
                await enqueue(conn, query_id=query_id, collection=collection, question_hash=question_hash,
                              trigger=trigger, prompt_name=prompt_name, prompt_version=prompt_version)


# The query, its answer and its local grades are written by one statement: each statement is a
# round trip with the driver's and SQLAlchemy's work around it (0.4-0.8 ms each here), and the
# four of them were most of the 4-5 ms the answer waited for its log (docs/benchmarks.md).
_QUERY_ROW = (
    "INSERT INTO queries (id, conversation_id, collection, question, resolved_question, intent, route, guardrails, "
    "outcome, question_hash, principals, api_key_id) VALUES (:id, :cid, :collection, :question, :resolved, "
    ":intent, :route, :guardrails, :outcome, :question_hash, CAST(:principals AS text[]), :api_key_id) RETURNING id")
_ANSWER_ROW = (
    "INSERT INTO answers (id, query_id, text, short_answer, citations, confidence, generator, model, prompt_name, "
    "prompt_version, experiment_id, variant, experiment_unit, llm_tokens, timings_ms, context, held) "
    "SELECT :answer_id, id, :a_text, :a_short, :a_citations, :a_confidence, :a_generator, :a_model, :a_prompt_name, "
    ":a_prompt_version, :a_experiment_id, :a_variant, :a_experiment_unit, :a_llm_tokens, :a_timings, :a_context, "
    ":a_held FROM logged_query")
# The answer's fields are bound with an "a_" prefix: one statement's parameters, none may shadow another's.
_QUERY_JSON, _ANSWER_JSON = ("intent", "route", "guardrails"), ("a_citations", "a_timings", "a_context", "a_llm_tokens")


async def write_entry(conn: AsyncConnection, entry: QueryLogEntry) -> None:
    """``QueryLog.record``'s writes, in the caller's transaction (a test holds one open)."""
    conversation_id = entry.conversation_id
    if conversation_id is not None:
        owned = (await conn.execute(text(
            "INSERT INTO conversations (id, collection, principals) "
            "VALUES (:cid, :collection, CAST(:principals AS text[])) ON CONFLICT (id) DO UPDATE "
            "SET updated_at = now() WHERE conversations.collection = EXCLUDED.collection "
            "AND conversations.principals = EXCLUDED.principals RETURNING id"),
            {"cid": conversation_id, "collection": entry.collection,
             "principals": sorted(set(entry.principals))})).first()
        if owned is None:
            conversation_id = None  # someone else's conversation: log the query alone
    parts = [f"logged_query AS ({_QUERY_ROW})"]
    json_names = list(_QUERY_JSON)
    params: dict[str, object] = {
        "id": entry.query_id, "cid": conversation_id, "collection": entry.collection, "question": entry.question,
        "resolved": entry.resolved_question, "intent": entry.intent, "route": entry.route,
        "guardrails": entry.guardrails, "outcome": entry.outcome, "question_hash": entry.question_hash,
        "principals": sorted(set(entry.principals)), "api_key_id": entry.api_key_id}
    cited: list[str] = []
    if entry.answer is not None:
        parts.append(f"logged_answer AS ({_ANSWER_ROW})")
        json_names += _ANSWER_JSON
        params.update(answer_id=uuid.uuid4(), **{f"a_{k}": v for k, v in entry.answer.model_dump().items()})
        cited = sorted({str(c["document_id"]) for c in entry.answer.citations if c.get("document_id")})
    if entry.evaluation is not None:
        parts.append(f"logged_scores AS ({SCORE_ROW.format(query_id='id')} FROM logged_query)")
        json_names.append("metrics")
        params.update(score_params("local-v1", entry.evaluation))
    parts.append(f"cited AS ({LOCK_CITED})")
    params["cited"] = cited
    statement = text(f"WITH {', '.join(parts)} SELECT id FROM cited").bindparams(
        *(bindparam(n, type_=JSONB) for n in json_names))
    present = set((await conn.execute(statement, params)).scalars())
    await forget_vanished(conn, entry.query_id, [i for i in cited if i not in present])
    if entry.review is not None and entry.answer is not None:
        await enqueue(conn, query_id=entry.query_id, collection=entry.collection,
                      question_hash=entry.question_hash, trigger=entry.review,
                      prompt_name=entry.answer.prompt_name, prompt_version=entry.answer.prompt_version,
                      item_id=entry.review_id)
    if conversation_id is not None:
        await conn.execute(text(
            "INSERT INTO conversation_turns (conversation_id, query_id, question, subject, answer) "
            "VALUES (:cid, :qid, :question, :subject, :answer)"),
            {"cid": conversation_id, "qid": entry.query_id,
             "question": entry.resolved_question or entry.question, "subject": entry.subject,
             "answer": entry.answer.text if entry.answer else None})
