"""The adaptive loop's judgement: confidence, relaxation, next action (pure functions)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from rag_service.domain import Candidate, SearchFilter, SearchHit
from rag_service.pipeline.retrieval.adaptive import LoopState, next_action, relaxed, retrieval_confidence


def candidate(cosine: float | None, strategies: tuple[str, ...]) -> Candidate:
    hit = SearchHit(chunk_id=uuid.uuid4(), document_id=uuid.uuid4(), parent_id=None, ordinal=0, source_uri="t://",
                    title=None, text="x", start_char=0, end_char=1, score=0.0)
    scores = {"semantic": cosine} if cosine is not None else {}
    return Candidate(hit=hit, fused_score=0.1, ranks={s: 1 for s in strategies}, scores=scores)


def test_confidence_rises_with_similarity_and_agreement() -> None:
    ran = {"semantic", "keyword"}
    weak = [candidate(0.25, ("semantic",)) for _ in range(3)]
    strong = [candidate(0.65, ("semantic", "keyword")) for _ in range(3)]
    assert retrieval_confidence([], ran) == 0.0
    assert retrieval_confidence(weak, ran) < 0.1
    assert retrieval_confidence(strong, ran) == 1.0
    mixed = [candidate(0.4, ("semantic", "keyword")), candidate(0.3, ("semantic",)), candidate(None, ("keyword",))]
    assert 0.3 < retrieval_confidence(mixed, ran) < 0.6


def test_confidence_without_judgeable_signals_is_none() -> None:
    assert retrieval_confidence([candidate(None, ("metadata",))], {"metadata"}) is None


def test_relaxing_keeps_collection_and_principals() -> None:
    flt = SearchFilter(collection="kb", principals=("hr",), tags_any=("x",), lob="infra",
                       date_from=datetime(2024, 1, 1, tzinfo=UTC))
    plain = relaxed(flt)
    assert plain == SearchFilter(collection="kb", principals=("hr",))
    assert relaxed(plain) is None


def test_actions_in_order_and_each_once() -> None:
    state = LoopState(results=2, top_k=10, filter_relaxable=True, subqueries=("a b", "c d"), variants=("v",),
                      tried=frozenset())
    order = []
    while (step := next_action(state)) is not None:
        order.append(step[0])
        state = LoopState(state.results, state.top_k, state.filter_relaxable, state.subqueries, state.variants,
                          state.tried | {step[0]})
    assert order == ["relax_filters", "decompose", "rewrite", "widen"]
    enough = LoopState(results=10, top_k=10, filter_relaxable=True, subqueries=(), variants=(), tried=frozenset())
    assert next_action(enough)[0] == "widen"  # enough results: filters stay
    full = LoopState(results=200, top_k=10, filter_relaxable=False, subqueries=(), variants=(), tried=frozenset(),
                     pool_full=True)
    assert next_action(full) is None  # a deeper search could not reach what the reranker sees
