"""The orchestrator over fakes of its collaborators (no database, no model): the plan it builds
from the route, concurrency of retrieval parts, the fallbacks, soft persistence, and errors that
name the step. The same pipeline over HTTP and real parts is tested in tests/test_api_query.py."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from rag_service.domain import (
    Candidate,
    Complexity,
    GeneratedAnswer,
    GuidelineSet,
    QueryLogEntry,
    QueryRequest,
    RetrievalRequest,
    RetrievalResult,
    SearchHit,
    Turn,
)
from rag_service.domain.prompts import PromptVersion
from rag_service.errors import DatabaseUnavailableError, NotFoundError, ProviderError, StepTimeoutError
from rag_service.pipeline.collaborators import (
    AnswerGenerator,
    CollectionCatalog,
    GuidelineSource,
    QueryHistory,
    Retrieves,
)
from rag_service.pipeline.config import PipelineConfig
from rag_service.pipeline.generation.tokens import TokenSink
from rag_service.pipeline.orchestrator import QueryPipeline
from rag_service.pipeline.router import default_guidelines
from rag_service.text.citations import verify_claims

NOW = datetime(2026, 6, 15, tzinfo=UTC)
PASSAGES = {
    "dough": "Knead the dough for ten minutes, then let it rise for about an hour.",
    "ivfflat": "IVFFlat partitions vectors into lists around k-means centroids.",
    "incident": "In March 2026 the connection pool was exhausted and clients saw error E-4012.",
}


def candidate(key: str, rank: int) -> Candidate:
    text = PASSAGES[key]
    hit = SearchHit(chunk_id=uuid.uuid5(uuid.NAMESPACE_URL, key), document_id=uuid.uuid5(uuid.NAMESPACE_DNS, key),
                    parent_id=None, ordinal=0, source_uri=f"{key}.md", title=key.title(), text=text, start_char=0,
                    end_char=len(text), score=1.0 / rank)
    return Candidate(hit=hit, fused_score=1.0 / rank, ranks={"semantic": rank}, scores={"semantic": 0.7 - 0.05 * rank})


class FakeRetriever:
    """Answers every request with the passages whose key words the query mentions."""

    def __init__(self, delay_s: float = 0.0, error: Exception | None = None) -> None:
        self.delay_s = delay_s
        self.error = error
        self.requests: list[RetrievalRequest] = []

    async def retrieve(self, request: RetrievalRequest) -> RetrievalResult:
        self.requests.append(request)
        await asyncio.sleep(self.delay_s)
        if self.error is not None:
            raise self.error
        words = request.query.lower()
        keys = [k for k in PASSAGES if k[:5] in words] or list(PASSAGES)
        return RetrievalResult(candidates=[candidate(k, i) for i, k in enumerate(keys, start=1)], iterations=[],
                               confidence=0.8, elapsed_ms=1.0)


class FakeLog:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.entries: list[QueryLogEntry] = []
        self.grades: list[dict] = []

    async def turns(self, conversation_id: str, collection: str, principals: Sequence[str],
                    limit: int = 5) -> list[Turn]:
        return []

    async def record(self, entry: QueryLogEntry) -> None:
        if self.fail:
            raise DatabaseUnavailableError("the query log is down")
        self.entries.append(entry)

    async def record_grades(self, query_id: uuid.UUID, **grades: object) -> None:
        self.grades.append({"query_id": query_id, **grades})


class FakeGuidelines:
    async def current(self) -> tuple[int, GuidelineSet]:
        return 7, default_guidelines()


class FakeCollections:
    async def collection_exists(self, name: str) -> bool:
        return name == "kb"


class ScriptedGenerator:
    """An LLM stand-in: streams a token, then (after ``delay_s``) answers with ``answer`` or raises
    ``error``."""

    name = "llm"
    prompt_name = "answer_cot"

    def __init__(self, answer: str = "", error: Exception | None = None, delay_s: float = 0.0) -> None:
        self.answer, self.error, self.delay_s = answer, error, delay_s

    async def generate(self, question: str, sub_questions: Sequence[str], context: Sequence[Candidate], *,
                       tier: Complexity = "simple", injection_flagged: bool = False,
                       retrieval_confidence: float | None = None,
                       on_token: TokenSink | None = None, prompt: PromptVersion | None = None) -> GeneratedAnswer:
        if on_token is not None:
            await on_token("Partial ")
        await asyncio.sleep(self.delay_s)
        if self.error is not None:
            raise self.error
        return GeneratedAnswer(answer=self.answer, citations=[], confidence=0.9, generator="llm", model="fake",
                               claims=verify_claims(self.answer, [c.hit.text for c in context]))


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    async def __call__(self, kind: str, data: dict[str, Any]) -> None:
        self.seen.append((kind, data))

    def kinds(self) -> list[str]:
        return [k for k, _ in self.seen]


def pipeline(retriever: FakeRetriever | None = None, log: FakeLog | None = None,
             generator: AnswerGenerator | None = None, **config: Any) -> QueryPipeline:
    return QueryPipeline(retriever=retriever or FakeRetriever(), collections=FakeCollections(),
                         guidelines=FakeGuidelines(), query_log=log or FakeLog(), generator=generator,
                         config=PipelineConfig(**{"retries": 2, **config}))


def ask(question: str, **fields: Any) -> QueryRequest:
    return QueryRequest(question=question, collection="kb", **fields)


def test_the_fakes_satisfy_the_protocols() -> None:
    assert isinstance(FakeRetriever(), Retrieves) and isinstance(FakeLog(), QueryHistory)
    assert isinstance(FakeGuidelines(), GuidelineSource) and isinstance(FakeCollections(), CollectionCatalog)
    assert isinstance(ScriptedGenerator(), AnswerGenerator)


async def test_an_answer_runs_the_plan_and_logs_a_masked_record() -> None:
    log, events = FakeLog(), Events()
    # The e-mail's words are in no passage, which makes abstaining likelier; this test is about the
    # plan and the log record, so abstention is off (test_no_answer_* covers it).
    result = await pipeline(log=log, abstain_below=0.0).run(
        ask("How long should the dough rise for ann@example.com"), events, NOW)
    assert result.outcome == "answered" and result.generator == "extractive"
    assert "[1]" in result.answer and result.citations[0].source_uri == "dough.md"
    assert [s.kind for s in result.steps] == ["guardrails", "intent", "route", "retrieve", "generate", "verify",
                                              "evaluate", "persist"]
    assert result.route.guidelines_version == 7
    kinds = events.kinds()
    assert kinds.index("intent") < kinds.index("route") < kinds.index("plan") < kinds.index("retrieval")
    assert kinds.index("token") < kinds.index("citation")
    [entry] = log.entries
    assert "ann@example.com" not in entry.model_dump_json() and entry.answer is not None
    assert entry.answer.timings["generate"] >= 0 and entry.outcome == "answered"


async def test_no_answer_when_the_passages_do_not_hold_it() -> None:
    log, events = FakeLog(), Events()
    result = await pipeline(log=log).run(ask("Who won the 2022 FIFA World Cup in Qatar?"), events, NOW)
    assert result.outcome == "no_answer" and "do not appear to answer" in result.answer
    assert result.citations == [] and result.short_answer is None
    assert result.closest_sources and not any(s.verified for s in result.closest_sources)
    assert result.confidence is not None and result.confidence < 0.1
    assert result.evaluation is None and result.review_id is None  # nothing to grade or review
    assert "token" in events.kinds()  # the statement streams like an answer
    [entry] = log.entries
    assert entry.outcome == "no_answer" and entry.answer is not None  # stored: what the caller got
    assert "do not appear to answer" in entry.answer.text


async def test_clarifications_and_declines_plan_only_persistence() -> None:
    retriever, log = FakeRetriever(), FakeLog()
    unclear = await pipeline(retriever, log).run(ask("compare it"), now=NOW)
    assert unclear.outcome == "clarification" and unclear.clarification.questions
    declined = await pipeline(retriever, log).run(ask("hi there"), now=NOW)
    assert declined.outcome == "declined" and declined.answer
    assert [s.kind for s in declined.steps] == ["guardrails", "intent", "route", "persist"]
    assert retriever.requests == [] and [e.outcome for e in log.entries] == ["clarification", "declined"]


async def test_an_unknown_collection_is_not_found_before_any_retrieval() -> None:
    retriever = FakeRetriever()
    with pytest.raises(NotFoundError, match="does not exist"):
        await pipeline(retriever).run(QueryRequest(question="What is IVFFlat?", collection="nope"))
    assert retriever.requests == []


async def test_question_parts_are_retrieved_concurrently() -> None:
    retriever = FakeRetriever(delay_s=0.5)
    started = time.perf_counter()
    result = await pipeline(retriever).run(
        ask("How long should dough be kneaded? How does IVFFlat partition vectors?"), now=NOW)
    elapsed = time.perf_counter() - started
    assert result.route.guideline == "multi-part"
    assert sorted(s.id for s in result.steps if s.kind == "retrieve") == ["retrieve-1", "retrieve-2"]
    assert elapsed < 0.9, "two 500 ms retrievals must overlap (in series: 1 s)"
    assert {"dough.md", "ivfflat.md"} <= {c.source_uri for c in result.citations}
    assert all(r.top_k == 4 for r in retriever.requests)  # the route's top_k shared between the parts


async def test_a_time_scoped_question_narrows_the_dates_and_relaxes_only_when_empty() -> None:
    retriever = FakeRetriever()
    result = await pipeline(retriever).run(ask("What failed since March?"), now=NOW)
    assert result.route.guideline == "time-scoped"
    [request] = retriever.requests
    assert request.filter.date_from == datetime(2026, 3, 1, tzinfo=UTC)
    assert request.relax_filters == "when_empty"


async def test_an_llm_failure_falls_back_to_an_extractive_answer() -> None:
    events = Events()
    result = await pipeline(generator=ScriptedGenerator(error=ProviderError("model overloaded"))).run(
        ask("How long should the dough rise?"), events, NOW)
    assert result.generator == "extractive" and "model overloaded" in result.fallback_reason
    generate = next(s for s in result.steps if s.kind == "generate")
    assert generate.status == "fallback" and "LLM generation failed" in generate.detail
    # The verified answer is the fallback's too, and its step says so.
    assert next(s for s in result.steps if s.kind == "verify").status == "fallback"
    kinds = events.kinds()
    # The caller saw "Partial " from the failed answer: it is told to discard it before the new text.
    assert kinds.index("token") < kinds.index("token.reset") < len(kinds) - kinds[::-1].index("token")


async def test_citations_that_resolve_to_nothing_are_repaired_by_the_verify_step() -> None:
    generator = ScriptedGenerator(answer="Knead the dough for ten minutes [1]. It rises for a week [9].")
    result = await pipeline(generator=generator).run(ask("How long should the dough rise?"), now=NOW)
    assert "[9]" not in result.answer and "[1]" in result.answer
    verify = next(s for s in result.steps if s.kind == "verify")
    assert verify.status == "fallback" and "[9]" in verify.detail
    assert "do not point at a retrieved chunk" in result.fallback_reason


async def test_an_extractive_quote_keeps_the_sources_own_bracketed_references() -> None:
    """A scientific sentence carries its own reference marks ("[14]"); quoted, they are not the
    answer's citations and must neither be dropped from the quote nor turn it into a fallback."""
    text = "Knead the dough for ten minutes [14], then let it rise for about an hour [2]."
    hit = SearchHit(chunk_id=uuid.uuid4(), document_id=uuid.uuid4(), parent_id=None, ordinal=0,
                    source_uri="dough.md", title="Dough", text=text, start_char=0, end_char=len(text), score=1.0)

    class OnePassage(FakeRetriever):
        async def retrieve(self, request: RetrievalRequest) -> RetrievalResult:
            return RetrievalResult(candidates=[Candidate(hit=hit, fused_score=1.0, ranks={"semantic": 1},
                                                         scores={"semantic": 0.8})],
                                   iterations=[], confidence=0.8, elapsed_ms=1.0)

    result = await pipeline(retriever=OnePassage(), abstain_below=0.0).run(
        ask("How long should the dough rise?"), now=NOW)
    assert result.generator == "extractive" and result.fallback_reason is None
    assert "[14]" in result.answer and result.answer.endswith("[1]")
    assert [c.n for c in result.citations] == [1]
    assert next(s for s in result.steps if s.kind == "verify").status == "ok"
    # The answer's claim cites the one passage it quotes, and that passage supports it.
    assert [(c.citations, c.verified) for c in result.claims] == [([1], True)]


async def test_a_persistence_failure_still_returns_the_answer() -> None:
    result = await pipeline(log=FakeLog(fail=True)).run(ask("What is IVFFlat?"), now=NOW)
    assert result.outcome == "answered" and result.answer
    persist = next(s for s in result.steps if s.kind == "persist")
    assert persist.status == "failed" and "down" in persist.detail


async def test_a_database_outage_in_retrieval_is_retried_then_reported_with_the_step() -> None:
    retriever = FakeRetriever(error=DatabaseUnavailableError("cannot reach PostgreSQL"))
    with pytest.raises(DatabaseUnavailableError) as caught:
        await pipeline(retriever).run(ask("What is IVFFlat?"), now=NOW)
    assert caught.value.step == "retrieve-1" and caught.value.status_code == 503
    assert len(retriever.requests) == 2  # PipelineConfig(retries=2)


async def test_an_llm_that_outlives_its_share_of_the_budget_falls_back_in_time() -> None:
    started = time.perf_counter()
    result = await pipeline(generator=ScriptedGenerator(answer="late [1]", delay_s=5.0),
                            generate_budget_s=1.0).run(ask("How long should the dough rise?"), now=NOW)
    assert time.perf_counter() - started < 2.5
    assert result.generator == "extractive" and "timed out" in result.fallback_reason
    generate = next(s for s in result.steps if s.kind == "generate")
    assert generate.status == "fallback" and 0.75 < generate.elapsed_ms / 1000 < 1.5


async def test_a_retrieval_that_runs_out_of_budget_is_a_timeout_naming_its_step() -> None:
    with pytest.raises(StepTimeoutError) as caught:
        await pipeline(FakeRetriever(delay_s=1.0), retrieve_budget_s=0.05).run(ask("What is IVFFlat?"), now=NOW)
    assert caught.value.step == "retrieve-1" and caught.value.status_code == 504
