"""The query log's write (db/repos/query_log.py) on a real PostgreSQL: what an answer leaves is all
stored, and the query, its answer and its local grades take one statement (the answer waits for it)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event, text

from rag_service.db.engine import Database
from rag_service.db.repos.query_log import QueryLog
from rag_service.domain import AnswerLogEntry, EvaluationReport, MetricValue, QueryLogEntry, ReviewTrigger
from tests.review.seed import citation, cited_documents_exist


def _entry(*, citations: list[dict[str, Any]], conversation_id: str | None = None, principals: list[str] | None = None,
           review: bool = False, answered: bool = True) -> QueryLogEntry:
    report = EvaluationReport(overall=0.55, needs_review=review,
                              reasons=["faithfulness: 0.40 < 0.80"] if review else [],
                              metrics={"faithfulness": MetricValue(value=0.4, reason="one claim unsupported",
                                                                   scorer="local-v1")})
    context = [{"n": 1, "chunk_id": citations[0]["chunk_id"], "score": 0.8}] if citations else []
    return QueryLogEntry(
        query_id=uuid.uuid4(), conversation_id=conversation_id, collection="log", principals=principals or [],
        question="How do I reset my password?", resolved_question=None, intent={"query_type": "factual"},
        route={"guideline": "default-answer"}, guardrails={}, outcome="answered" if answered else "declined",
        answer=AnswerLogEntry(text="Reset it from the settings page [1].", short="the settings page",
                              citations=citations, confidence=0.7, generator="extractive", model=None,
                              prompt_name="answer_extractive", prompt_version=1, timings={"generate": 3.5},
                              context=context)
        if answered else None,
        subject="password", question_hash="h1", evaluation=report if answered else None,
        review=ReviewTrigger(source="evaluator", tier="normal", reasons=("overall: 0.55 < 0.80",), overall=0.55)
        if review else None)


@contextmanager
def _statements(database: Database) -> Iterator[list[str]]:
    """The statements the engine sends while the block runs (BEGIN and COMMIT are not statements)."""
    seen: list[str] = []

    def before(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(" ".join(statement.split()))

    engine = database.engine.sync_engine
    event.listen(engine, "before_cursor_execute", before)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", before)


async def _row(database: Database, sql: str, query_id: uuid.UUID) -> Any:
    async with database.connect() as conn:
        return (await conn.execute(text(sql), {"q": query_id})).one_or_none()


async def test_an_answer_with_its_grades_is_one_statement_and_all_of_it_is_stored(database: Database) -> None:
    document = uuid.uuid4()
    cited = [citation(1, uuid.uuid4(), document)]
    await cited_documents_exist(database, "log", cited)
    plain = _entry(citations=cited)
    # Every column given a value (each goes through INSERT ... SELECT's typing of its parameter).
    key, experiment = uuid.uuid4(), uuid.uuid4()
    entry = plain.model_copy(update={
        "resolved_question": "How do I reset my account password?", "principals": ["team-b", "team-a"],
        "route": {"guideline": "default-answer"}, "guardrails": {"pii": ["email"]}, "api_key_id": key,
        "outcome": "pending_review",
        "evaluation": plain.evaluation.model_copy(update={"reasons": ["faithfulness: 0.40 < 0.80"]}),
        "answer": plain.answer.model_copy(update={
            "generator": "llm", "model": "small-model", "experiment_id": experiment, "variant": "b",
            "experiment_unit": "conversation-7", "llm_tokens": {"prompt": 120, "completion": 30}, "held": True})})
    with _statements(database) as statements:
        await QueryLog(database).record(entry)
    assert len(statements) == 1 and statements[0].startswith("WITH logged_query AS (INSERT INTO queries"), statements

    query = await _row(database, "SELECT question, resolved_question, outcome, intent, route, guardrails, "
                                 "question_hash, principals, api_key_id FROM queries WHERE id = :q", entry.query_id)
    assert tuple(query) == ("How do I reset my password?", "How do I reset my account password?", "pending_review",
                            {"query_type": "factual"}, {"guideline": "default-answer"}, {"pii": ["email"]}, "h1",
                            ["team-a", "team-b"], key)
    answer = await _row(database, "SELECT text, short_answer, citations, confidence, generator, model, prompt_name, "
                                  "prompt_version, experiment_id, variant, experiment_unit, llm_tokens, timings_ms, "
                                  "context, held FROM answers WHERE query_id = :q", entry.query_id)
    assert answer.text == "Reset it from the settings page [1]." and answer.short_answer == "the settings page"
    assert answer.citations == cited and "deleted" not in answer.citations[0]  # its document is there
    assert (answer.confidence, answer.generator, answer.model) == (0.7, "llm", "small-model")
    assert (answer.prompt_name, answer.prompt_version) == ("answer_extractive", 1)
    assert (answer.experiment_id, answer.variant, answer.experiment_unit) == (experiment, "b", "conversation-7")
    assert answer.llm_tokens == {"prompt": 120, "completion": 30} and answer.held is True
    assert answer.timings_ms == {"generate": 3.5} and answer.context[0]["score"] == 0.8
    scores = await _row(database, "SELECT scorer, overall, needs_review, reasons, metrics FROM answer_scores "
                                  "WHERE query_id = :q", entry.query_id)
    assert (scores.scorer, scores.overall, scores.needs_review) == ("local-v1", 0.55, False)
    assert scores.reasons == ["faithfulness: 0.40 < 0.80"] and scores.metrics["faithfulness"]["value"] == 0.4
    assert await _row(database, "SELECT id FROM review_items WHERE query_id = :q", entry.query_id) is None


async def test_a_declined_query_is_logged_without_an_answer(database: Database) -> None:
    entry = _entry(citations=[], answered=False)
    with _statements(database) as statements:
        await QueryLog(database).record(entry)
    assert len(statements) == 1
    assert (await _row(database, "SELECT outcome FROM queries WHERE id = :q", entry.query_id)).outcome == "declined"
    assert await _row(database, "SELECT id FROM answers WHERE query_id = :q", entry.query_id) is None
    assert await _row(database, "SELECT query_id FROM answer_scores WHERE query_id = :q", entry.query_id) is None


async def test_a_queued_answer_in_a_conversation_stores_its_turn_and_review_item(database: Database) -> None:
    conversation = f"conv-{uuid.uuid4().hex}"
    entry = _entry(citations=[], conversation_id=conversation, principals=["team-a"], review=True)
    await QueryLog(database).record(entry)
    item = await _row(database, "SELECT tier, question_hash, prompt_version FROM review_items WHERE query_id = :q",
                      entry.query_id)
    assert tuple(item) == ("normal", "h1", 1)
    logged = await _row(database, "SELECT conversation_id FROM queries WHERE id = :q", entry.query_id)
    assert logged.conversation_id == conversation
    turns = await QueryLog(database).turns(conversation, "log", ["team-a"])
    assert [(t.question, t.subject) for t in turns] == [("How do I reset my password?", "password")]

    # Another caller naming the same conversation: its query is logged alone, the turn is not added.
    other = _entry(citations=[], conversation_id=conversation, principals=["team-b"])
    await QueryLog(database).record(other)
    assert (await _row(database, "SELECT conversation_id FROM queries WHERE id = :q", other.query_id)).conversation_id \
        is None
    assert len(await QueryLog(database).turns(conversation, "log", ["team-a"])) == 1
    assert await QueryLog(database).turns(conversation, "log", ["team-b"]) == []
