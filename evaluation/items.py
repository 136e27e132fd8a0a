"""One dataset item through the service, measured: retrieval only, or the whole query pipeline with
its grades. Each returns an :class:`EvalItemResult` with the IR and answer metrics joined; a failure
of the service on the item is recorded on it (``error``), not raised, so one bad item does not stop
a run of thousands.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from evaluation.metrics import SQUAD_SCORER, AnswerMetrics, ir_metrics, relevant_rank, squad_scores
from rag_service.domain import (
    REFERENCE_CORRECTNESS,
    EvalItemResult,
    EvaluationReport,
    QueryRequest,
    QueryResult,
    RetrievalRequest,
    RetrievalResult,
    RetrievedRef,
    SearchFilter,
    collection_name,
)
from rag_service.domain.costs import Prices, generation_cost
from rag_service.domain.retrieval import MAX_QUERY_CHARS
from rag_service.errors import RagServiceError
from rag_service.pipeline.collaborators import Retrieves
from rag_service.pipeline.orchestrator import QueryPipeline
from rag_service.scoring.correctness import against_reference
from rag_service.scoring.evidence import LOCAL_SCORER, content_terms
from rag_service.text.citations import strip_markers

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
RETRIEVAL_DEPTH = 100  # documents ranked per query: enough for Recall@100

ContextTexts = Callable[[Sequence[uuid.UUID]], Awaitable[dict[uuid.UUID, str]]]


@dataclass(frozen=True)
class EvalItem:
    """What the runner needs of a dataset item, whatever its format."""

    id: str
    question: str
    relevant: Mapping[str, int] = field(default_factory=dict)  # corpus id -> graded relevance
    references: tuple[str, ...] = ()  # reference answers
    reference_contexts: tuple[str, ...] = ()
    collection: str | None = None  # golden items are asked where they were asked


def ranked_documents(source_ids: Sequence[str]) -> list[str]:
    """Chunks collapse to their document, which ranks where its first chunk does."""
    return list(dict.fromkeys(source_ids))


def _error(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, RagServiceError) else f"{type(exc).__name__}: {exc}"


def _with_ir(result: EvalItemResult, item: EvalItem, documents: Sequence[str]) -> None:
    result.retrieved = result.retrieved or [RetrievedRef(rank=i, id=d) for i, d in enumerate(documents, start=1)]
    if any(grade > 0 for grade in item.relevant.values()):
        result.metrics.update(ir_metrics({item.id: item.relevant}, {item.id: documents}).get(item.id, {}))
        result.relevant_rank = relevant_rank(item.relevant, documents)
        result.scorers.update({name: "ranx" for name in ir_metrics_names(result.metrics)})


def ir_metrics_names(metrics: Mapping[str, object]) -> list[str]:
    return [name for name in metrics if "@" in name]


async def retrieval_item(retriever: Retrieves, item: EvalItem, collection: str, repetition: int,
                         fields: Mapping[str, Any] | None = None) -> EvalItemResult:
    """``fields``: request fields beyond query, collection and depth (strategies, rerank, adaptive), for
    benchmarks that measure one configuration of the retriever; a run leaves them to the settings."""
    result = EvalItemResult(item_id=item.id, repetition=repetition, question=item.question,
                            references=list(item.references))
    request = RetrievalRequest(query=item.question[:MAX_QUERY_CHARS], filter=SearchFilter(collection=collection),
                               top_k=RETRIEVAL_DEPTH, **(fields or {}))
    started = time.perf_counter()
    try:
        found: RetrievalResult = await retriever.retrieve(request)
    except Exception as exc:  # recorded on the item; the run goes on
        result.error = _error(exc)
        result.latency_ms = {"total": round((time.perf_counter() - started) * 1000, 2)}
        return result
    result.latency_ms = {**_strategy_latency(found), "total": round((time.perf_counter() - started) * 1000, 2)}
    first_scores: dict[str, float] = {}
    for candidate in found.candidates:
        score = candidate.rerank_score if candidate.rerank_score is not None else candidate.fused_score
        first_scores.setdefault(candidate.hit.source_uri, float(score))
    documents = ranked_documents([c.hit.source_uri for c in found.candidates])
    result.retrieved = [RetrievedRef(rank=i, id=d, score=first_scores[d]) for i, d in enumerate(documents, start=1)]
    _with_ir(result, item, documents)
    if found.rerank is not None:  # the reranker gives up after its timeout and keeps the fused order
        result.metrics["reranked"] = float(found.rerank.applied)
        result.scorers["reranked"] = found.rerank.reranker
    return result


def _strategy_latency(found: RetrievalResult) -> dict[str, float]:
    """Each strategy's time in the first iteration, the reranker's, and the adaptive loop's extra ones."""
    latency: dict[str, float] = {}
    if found.iterations:
        for report in found.iterations[0].strategies:
            latency[report.strategy] = round(report.elapsed_ms, 2)
    if found.rerank is not None:
        latency["rerank"] = round(found.rerank.elapsed_ms, 2)
    if len(found.iterations) > 1:
        latency["adaptive_iterations"] = float(len(found.iterations) - 1)
    return latency


@dataclass
class Captured:
    """What the pipeline's events say that its result does not: the ranked context."""

    retrieval: list[dict[str, Any]] = field(default_factory=list)

    async def __call__(self, event: str, data: dict[str, Any]) -> None:
        if event == "retrieval":
            self.retrieval = list(data.get("results") or [])


async def full_item(pipeline: QueryPipeline, item: EvalItem, collection: str, repetition: int, *,
                    answer_metrics: AnswerMetrics, context_texts: ContextTexts, prices: Prices,
                    late_grades: Mapping[uuid.UUID, EvaluationReport], wait_for_grades: bool) -> EvalItemResult:
    result = EvalItemResult(item_id=item.id, repetition=repetition, question=item.question,
                            references=list(item.references))
    captured = Captured()
    started = time.perf_counter()
    try:
        # The request is built with the collection's name (what the API validates), then pointed at its
        # stored key, which holds the run's tenant (domain/tenants.py).
        key = item.collection or collection
        request = QueryRequest(question=item.question[:4000], collection=collection_name(key))
        answered: QueryResult = await pipeline.run(request.model_copy(update={"collection": key}), emit=captured)
        if wait_for_grades:
            await pipeline.drain()  # the LLM judge grades after the answer; its grades are the better ones
    except Exception as exc:  # recorded on the item; the run goes on
        result.error = _error(exc)
        result.latency_ms = {"total": round((time.perf_counter() - started) * 1000, 2)}
        return result
    result.latency_ms = {**answered.timings_ms}
    result.answer, result.short_answer, result.outcome = answered.answer, answered.short_answer, answered.outcome
    result.tokens = answered.llm_tokens
    result.cost_usd = generation_cost(answered.generator, answered.llm_tokens, prices)
    report = late_grades.get(answered.query_id, answered.evaluation)
    if report is not None:
        result.metrics["overall"] = report.overall
        result.scorers["overall"] = "weighted mean"
        for metric, value in report.metrics.items():
            result.metrics[metric] = value.value
            result.scorers[metric] = value.scorer
    documents = ranked_documents([r["source_uri"] for r in captured.retrieval])
    result.retrieved = [RetrievedRef(rank=i, id=d) for i, d in enumerate(documents, start=1)]
    _with_ir(result, item, documents)
    # As SQuAD scores it: the extracted span, else the answer's first sentence (an answer is longer than
    # its reference span; whole-text F1 would mostly measure length). An abstention predicts nothing.
    prediction = (answered.short_answer or first_sentence(answered.answer or "")) \
        if answered.outcome == "answered" else None
    if item.references:
        squad = squad_scores(prediction or "", item.references)
        result.metrics.update(squad)
        result.scorers.update({name: SQUAD_SCORER for name in squad})
        result.metrics[REFERENCE_CORRECTNESS], result.scorers[REFERENCE_CORRECTNESS] = \
            reference_correctness(answered.answer if prediction is not None else None, item.references)
    chunk_ids = [uuid.UUID(r["chunk_id"]) for r in captured.retrieval if r.get("chunk_id")]
    texts = await context_texts(chunk_ids) if chunk_ids else {}
    values, scorers = await answer_metrics.score(
        answer=prediction, references=item.references, question=item.question,
        retrieved_contexts=[texts[c] for c in chunk_ids if c in texts], reference_contexts=item.reference_contexts)
    result.metrics.update(values)
    result.scorers.update(scorers)
    return result


def reference_correctness(answer: str | None, references: Sequence[str]) -> tuple[float | None, str]:
    """The local scorer's correctness of the whole answer against its best reference: no answer
    scores 0; references with no content to compare (all stop words) give no score."""
    if not any(content_terms(reference) for reference in references):
        return None, LOCAL_SCORER
    scored = [against_reference(answer, reference) for reference in references] if answer else []
    values = [s.value for s in scored if s.value is not None]
    return (max(values) if values else 0.0), LOCAL_SCORER


def first_sentence(answer: str) -> str:
    text = strip_markers(answer).strip()
    return _SENTENCE_END.split(text, maxsplit=1)[0]
