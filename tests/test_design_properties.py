"""The design's properties (issue 14, part 6) as hypothesis tests over pure pieces, one section per property:

(b) fused results have no duplicates and keep every strategy's best candidate;
(c) guideline priority order is deterministic, and no match means the fallback route;
(d) low intent confidence means a clarification or the fallback route;
(e) scores are in [0, 1].

(a), (f) and (g), which run the whole pipeline or store through the repositories, are in
test_design_properties_pipeline.py. Every property runs at least 100 examples.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np
from hypothesis import assume, event, given
from hypothesis import strategies as st

from rag_service.domain import (
    METRICS,
    Candidate,
    Condition,
    Entities,
    Evaluation,
    EvaluationReport,
    EvidenceContext,
    Guideline,
    GuidelineSet,
    Intent,
    RetrievalRequest,
    RouteSpec,
    SearchHit,
    TimeRangeModel,
)
from rag_service.domain.strategies import strategy_names
from rag_service.pipeline.intent import IntentParser
from rag_service.pipeline.intent_llm import RULES_UNSURE_BELOW
from rag_service.pipeline.results import merge_contexts
from rag_service.pipeline.retrieval.adaptive import retrieval_confidence
from rag_service.pipeline.retrieval.fusion import RankedList, reciprocal_rank_fusion
from rag_service.pipeline.retrieval.retriever import RetrievalConfig, Retriever
from rag_service.pipeline.retrieval.strategies import StrategyQuery
from rag_service.pipeline.router import default_guidelines, route
from rag_service.scoring.combine import combine
from rag_service.scoring.evidence import ScoringInput
from rag_service.scoring.local import score_metrics
from tests.property_standins import (
    CLAUSES,
    METRIC_VALUES,
    NOW,
    PIPELINE,
    PURE,
    scored,
)

# === (b) fused results: no duplicates, every strategy's best candidate kept ==================================

DOC = uuid.uuid4()
CHUNKS = [uuid.UUID(int=i + 1) for i in range(30)]
STRATEGIES = ("semantic", "keyword", "pattern", "metadata")


def hit(i: int, score: float = 1.0) -> SearchHit:
    return SearchHit(chunk_id=CHUNKS[i], document_id=DOC, parent_id=None, ordinal=i, source_uri="t://d", title=None,
                     text=f"chunk {i}", start_char=0, end_char=7, score=score)


RANKED = st.builds(
    lambda name, items, factor: RankedList(name, [hit(i, s) for i, s in items], factor),
    st.sampled_from(STRATEGIES),
    st.lists(st.tuples(st.integers(0, 29), st.floats(-5, 5, allow_nan=False)), max_size=20),
    st.sampled_from([1.0, 0.5, 0.25]))


@PURE
@given(lists=st.lists(RANKED, max_size=8),
       weights=st.dictionaries(st.sampled_from(STRATEGIES), st.floats(0, 3, allow_nan=False)),
       k=st.floats(0, 100, allow_nan=False))
def test_fusion_has_no_duplicates_and_keeps_every_strategys_best(lists: list[RankedList], weights: dict[str, float],
                                                                 k: float) -> None:
    """(b) Reciprocal-rank fusion of any lists (repeated strategies = query variants, chunks named
    twice in a list, any weights, zero weights included) returns each chunk once, every chunk any
    strategy found, and each strategy's best candidate with that strategy's rank 1 and its score."""
    fused = reciprocal_rank_fusion(lists, weights, k)
    ids = [c.hit.chunk_id for c in fused]
    assert len(ids) == len(set(ids)), "a chunk is fused twice"
    assert set(ids) == {h.chunk_id for r in lists for h in r.hits}
    by_id = {c.hit.chunk_id: c for c in fused}
    for ranked in lists:
        if ranked.hits:
            best = by_id[ranked.hits[0].chunk_id]
            assert best.ranks[ranked.strategy] == 1
            first = next(r for r in lists if r.strategy == ranked.strategy and r.hits
                         and r.hits[0].chunk_id == best.hit.chunk_id)
            assert best.scores[ranked.strategy] == first.hits[0].score
    for c in fused:  # each strategy's rank is its best over all its lists
        for strategy, rank in c.ranks.items():
            assert rank == min(r.hits.index(next(h for h in r.hits if h.chunk_id == c.hit.chunk_id)) + 1
                               for r in lists if r.strategy == strategy and c.hit.chunk_id in
                               {h.chunk_id for h in r.hits})
    assert all(a.fused_score >= b.fused_score for a, b in zip(fused, fused[1:], strict=False))


class ListedStrategy:
    """A strategy whose hits are given: ``first`` for the question as asked, a rotation of the
    same for any other query the adaptive loop tries (rewrites, parts)."""

    def __init__(self, name: str, first: list[int], top_score: float) -> None:
        self.name, self.needs_embedding, self.first, self.top_score = name, name == "semantic", first, top_score

    async def search(self, query: StrategyQuery) -> list[SearchHit]:
        items = self.first if query.text == QUESTION else self.first[len(query.text) % 3:] + self.first[:1]
        return [hit(i, self.top_score - 0.01 * n) for n, i in enumerate(items)][: query.top_k]


class ZeroEmbedder:
    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        return np.zeros((len(texts), 4), dtype=np.float32)


QUESTION = "How does the connection pool recover and why did error E-4012 appear?"


@PIPELINE
@given(found=st.fixed_dictionaries({s: st.lists(st.integers(0, 29), max_size=12) for s in STRATEGIES}),
       adaptive=st.booleans(), top_k=st.integers(1, 30), top_score=st.floats(0, 0.9))
async def test_the_retrievers_fused_list_keeps_every_strategys_best(found: dict[str, list[int]], adaptive: bool,
                                                                    top_k: int, top_score: float) -> None:
    """(b) Through the Retriever (strategies run concurrently, the adaptive loop fusing what each
    iteration found): the fused list holds each chunk once and every strategy's first hit for the
    question, ranked 1 by that strategy; what ``retrieve`` returns has no duplicates either."""
    # A low top score (the semantic cosine) makes the adaptive loop act: more lists are fused.
    strategies = {name: ListedStrategy(name, items, top_score) for name, items in found.items()}
    retriever = Retriever(store=None, embedder=ZeroEmbedder(), strategies=strategies,  # type: ignore[arg-type]
                          reranker=None, config=RetrievalConfig(strategies=STRATEGIES, adaptive=adaptive,
                                                                time_budget_ms=5_000))
    request = RetrievalRequest(query=QUESTION, top_k=top_k, strategies=STRATEGIES)
    fused, iterations, _, _ = await retriever.fused_candidates(request)
    event(f"{len(iterations)} iteration(s)")
    ids = [c.hit.chunk_id for c in fused]
    assert len(ids) == len(set(ids))
    by_id = {c.hit.chunk_id: c for c in fused}
    for name, items in found.items():
        if items:
            assert by_id[CHUNKS[items[0]]].ranks[name] == 1, (name, iterations)
    top = (await retriever.retrieve(request)).candidates
    assert len(top) == min(top_k, len(ids)) and len({c.hit.chunk_id for c in top}) == len(top)


def candidates(items: list[int]) -> list[Candidate]:
    return [Candidate(hit=hit(i), fused_score=1.0 / n, ranks={"semantic": n}) for n, i in enumerate(items, 1)]


@PURE
@given(parts=st.lists(st.lists(st.integers(0, 29), max_size=10, unique=True), min_size=1, max_size=6),
       extra=st.integers(0, 20))
def test_merging_the_parts_has_no_duplicates_and_keeps_each_parts_best(parts: list[list[int]], extra: int) -> None:
    """(b) The orchestrator's merge of the parts' fused lists (round robin) holds each chunk once
    and, when the context has room for one chunk per part, every part's best candidate."""
    limit = len(parts) + extra
    merged = merge_contexts([candidates(p) for p in parts], limit)
    ids = [c.hit.chunk_id for c in merged]
    assert len(ids) == len(set(ids))
    assert len(ids) == min(limit, len({i for p in parts for i in p}))
    assert {CHUNKS[p[0]] for p in parts if p} <= set(ids)


# === (c) guideline priority order is deterministic; no match means the fallback route =========================

NAMES = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa")
QUERY_TYPES = ("factual", "exact_lookup", "comparison", "multi_step", "summary", "temporal", "out_of_scope")
COMPLEXITIES = ("simple", "moderate", "complex")
CONDITION_FIELDS = {
    "query_types": st.lists(st.sampled_from(QUERY_TYPES), min_size=1, max_size=3),
    "complexity": st.lists(st.sampled_from(COMPLEXITIES), min_size=1, max_size=2),
    "min_ambiguity": st.sampled_from([0.0, 0.2, 0.5, 0.8]), "has_identifiers": st.booleans(),
    "has_quoted": st.booleans(), "has_time_range": st.booleans(), "min_sub_questions": st.integers(0, 3),
    "needs_clarification": st.booleans(),
    "question_matches": st.sampled_from([r"(?i)\bcompare\b", r"E-\d+", r"^[A-Z]", r"pool|refund"]),
}
# A few fields per condition (an empty one always matches), so that guidelines often match.
CONDITIONS = st.lists(st.sampled_from(sorted(CONDITION_FIELDS)), max_size=3, unique=True).flatmap(
    lambda names: st.fixed_dictionaries({n: CONDITION_FIELDS[n] for n in names})).map(lambda f: Condition(**f))
ROUTES = st.builds(
    RouteSpec, action=st.sampled_from(["answer", "answer", "clarify", "decline"]),
    strategies=st.none() | st.lists(st.sampled_from(STRATEGIES), min_size=1, max_size=4, unique=True),
    top_k=st.none() | st.integers(1, 50), rerank=st.none() | st.booleans(), adaptive=st.none() | st.booleans(),
    tier=st.none() | st.sampled_from(COMPLEXITIES), use_time_filter=st.booleans(), split_parts=st.booleans())
FALLBACKS = ROUTES.map(lambda r: r.model_copy(update={"action": "answer"}))


@st.composite
def guideline_sets(draw: st.DrawFn) -> GuidelineSet:
    names = draw(st.lists(st.sampled_from(NAMES), max_size=8, unique=True))
    # Few priorities, so ties (broken by name) are common.
    guidelines = [Guideline(name=n, priority=draw(st.integers(0, 4)), when=draw(CONDITIONS), route=draw(ROUTES))
                  for n in names]
    return GuidelineSet(guidelines=guidelines, fallback=draw(FALLBACKS))


QUESTIONS = st.sampled_from(["Compare the pool and the refund window", "error E-4012", "what is it",
                             "How long should the dough rise?", "summarize the incident since March"])


def intents(confidence: st.SearchStrategy[float] = st.floats(0, 1)) -> st.SearchStrategy[Intent]:
    return st.builds(
        lambda question, **kw: Intent(question=question, original=question, missing=[], **kw),
        QUESTIONS, query_type=st.sampled_from(QUERY_TYPES), complexity=st.sampled_from(COMPLEXITIES),
        entities=st.builds(Entities, identifiers=st.lists(st.just("E-4012"), max_size=1),
                           quoted=st.lists(st.just("pool exhausted"), max_size=1)),
        time_ranges=st.lists(st.just(TimeRangeModel(expression="since March", start=datetime(2026, 3, 1, tzinfo=UTC),
                                                    end=None)), max_size=1),
        sub_questions=st.lists(st.sampled_from(CLAUSES), max_size=4), ambiguity=st.floats(0, 1),
        clarifications=st.lists(st.just("Which document do you mean?"), max_size=1), confidence=confidence)


def matches_alone(intent: Intent, guideline: Guideline, fallback: RouteSpec) -> bool:
    """Whether the router takes this guideline when it is the only one (its condition holds for the intent)."""
    return route(intent, GuidelineSet(guidelines=[guideline], fallback=fallback)).guideline == guideline.name


@PURE
@given(intent=intents(), guidelines=guideline_sets(), order=st.randoms(use_true_random=False))
def test_guideline_priority_order_is_deterministic_and_no_match_takes_the_fallback(
        intent: Intent, guidelines: GuidelineSet, order: Any) -> None:
    """(c) The decision is the guideline that comes first by (priority, name) among those that
    match, whatever order the set lists them in and however often it is asked; when none matches,
    the decision names no guideline, says so, and is the fallback route."""
    decision = route(intent, guidelines, 3)
    shuffled = list(guidelines.guidelines)
    order.shuffle(shuffled)
    again = route(intent, GuidelineSet(guidelines=shuffled, fallback=guidelines.fallback), 3)
    assert again == decision and route(intent, guidelines, 3) == decision
    matching = [g for g in guidelines.guidelines if matches_alone(intent, g, guidelines.fallback)]
    first = min(matching, key=lambda g: (g.priority, g.name), default=None)
    event("matched" if first else "no match")
    if first is not None:
        assert decision.guideline == first.name
        assert decision.route.action == first.route.action
        return
    fallback = guidelines.fallback
    assert decision.guideline is None and "fallback" in decision.reasons[-1]
    assert decision.route.action == "answer"
    assert decision.route.strategies == list(fallback.strategies or strategy_names())
    assert decision.route.top_k == (fallback.top_k or 6)
    assert (decision.route.use_time_filter, decision.route.split_parts) == (fallback.use_time_filter,
                                                                           fallback.split_parts)
    assert decision.route.tier == (fallback.tier or intent.complexity)


# === (d) low intent confidence means a clarification or the fallback route ===================================

# Found by these tests: the router used to ignore the intent's confidence. It now skips every guideline
# that does not ask back when the rules are unsure (router.route), and the parser rates a question it
# splits into parts as sure (its other cues are its parts'), so multi-part routing keeps working.
# Words that cue each query type; a question with cues of several types leaves the rules unsure.
CUES = {"summary": ("summarize", "an overview of"), "comparison": ("compare", "versus"),
        "temporal": ("since March 2026", "the latest"), "multi_step": ("step by step", "and then"),
        "exact_lookup": ("find error E-4012", 'find "pool exhausted"')}
FILLER = ("the refund window", "the connection pool", "pricing", "the incident report", "IVFFlat")


@st.composite
def unsure_questions(draw: st.DrawFn) -> str:
    kinds = draw(st.lists(st.sampled_from(sorted(CUES)), min_size=3, max_size=5, unique=True))
    pieces = [draw(st.sampled_from(CUES[k])) for k in kinds] + draw(st.lists(st.sampled_from(FILLER), max_size=3))
    return " ".join(draw(st.permutations(pieces))) + "?"


@PURE
@given(question=unsure_questions())
def test_low_intent_confidence_asks_back_or_takes_the_fallback(question: str) -> None:
    """(d) When the rules are unsure what a question asks (confidence below RULES_UNSURE_BELOW:
    its cues name several query types), the shipped guidelines either ask back or take the
    fallback route: no guideline acts on a guessed query type."""
    intent = IntentParser().parse(question, NOW)
    assume(intent.confidence < RULES_UNSURE_BELOW)
    decision = route(intent, default_guidelines())
    event(f"{decision.guideline or 'fallback'}")
    assert decision.route.action == "clarify" or decision.guideline is None, (question, intent.query_type, decision)


@PURE
@given(intent=intents(st.floats(0, RULES_UNSURE_BELOW, exclude_max=True)), guidelines=guideline_sets())
def test_low_intent_confidence_asks_back_or_takes_the_fallback_for_any_guidelines(
        intent: Intent, guidelines: GuidelineSet) -> None:
    """(d) The same for any guideline set: an unsure intent is asked back or routed to the fallback."""
    decision = route(intent, guidelines)
    event("clarify" if decision.route.action == "clarify" else "fallback" if decision.guideline is None else "other")
    assert decision.route.action == "clarify" or decision.guideline is None, decision


# === (e) scores in [0, 1] =====================================================================================

VOCABULARY = ("the", "refund", "window", "is", "30", "days", "from", "delivery", "customers", "in", "Norway", "are",
              "not", "eligible", "never", "5", "business", "March", "2024", "1843", "Ada", "Lovelace", "1,000",
              "45%", "paid", "card", "it", "was", "[1]", "[2]", "[9]", '"exactly', 'this"', "E-4012", "how", "when")
SENTENCES = st.builds(lambda words, end: " ".join(words) + end, st.lists(st.sampled_from(VOCABULARY), min_size=1,
                                                                         max_size=14), st.sampled_from([".", "?", "!",
                                                                                                        ""]))
TEXTS = st.lists(SENTENCES, max_size=4).map(" ".join) | st.text(max_size=60)
DATES = st.datetimes(datetime(1990, 1, 1), datetime(2035, 1, 1), timezones=st.just(UTC))


@PURE
@given(question=TEXTS, answer=TEXTS, reference=st.none() | TEXTS, parts=st.lists(TEXTS, max_size=3),
       contexts=st.lists(st.builds(EvidenceContext, text=TEXTS, effective_date=st.none() | DATES), max_size=4),
       now=DATES, similarity=st.none() | st.floats(-1.01, 1.01), half_life=st.floats(1, 10_000),
       weights=st.fixed_dictionaries({m: st.floats(0, 2) for m in METRICS}), judge=METRIC_VALUES, ragas=METRIC_VALUES)
def test_every_score_is_in_the_unit_interval(question: str, answer: str, reference: str | None, parts: list[str],
                                             contexts: list[EvidenceContext], now: datetime, similarity: float | None,
                                             half_life: float, weights: dict[str, float],
                                             judge: list[float | None], ragas: list[float | None]) -> None:
    """(e) Each of the seven local scores, the LLM graders' combined scores and the weighted
    overall are in [0, 1] (or None: could not judge), for any answer, evidence, dates (future ones
    too), similarity and weights; the overall lies between the lowest and highest score."""
    inp = ScoringInput(question=question or "?", answer=answer, contexts=contexts, parts=parts, reference=reference,
                       now=now, similarity=similarity)
    local = score_metrics(inp, half_life)
    combined = combine(local, scored(judge, "judge"), scored(ragas, "ragas"))
    for scores in (local, combined):
        assert [s.metric for s in scores] == list(METRICS)
        values = [s.value for s in scores if s.value is not None]
        assert all(0 <= v <= 1 for v in values), scores
        overall = Evaluation.from_scores(scores, weights).overall
        if overall is not None:
            assert 0 <= overall <= 1 and min(values) - 5e-5 <= overall <= max(values) + 5e-5  # rounded to 4 places
        EvaluationReport.of(Evaluation.from_scores(scores, weights), False, [])  # the API's model accepts them


@PURE
@given(found=st.lists(st.tuples(st.integers(0, 29), st.dictionaries(st.sampled_from(STRATEGIES),
                                                                     st.floats(-1.01, 1.01), max_size=4)),
                      max_size=12),
       ran=st.sets(st.sampled_from(STRATEGIES)), intent=intents(), guidelines=guideline_sets())
def test_retrieval_and_route_confidences_are_in_the_unit_interval(
        found: list[tuple[int, dict[str, float]]], ran: set[str], intent: Intent, guidelines: GuidelineSet) -> None:
    """(e) The retrieval confidence the adaptive loop acts on and the route's confidence are in [0, 1]."""
    fused = [Candidate(hit=hit(i), fused_score=1.0, ranks={s: n for s in scores}, scores=scores)
             for n, (i, scores) in enumerate(found, start=1)]
    confidence = retrieval_confidence(fused, ran)
    assert confidence is None or 0 <= confidence <= 1
    assert 0 <= route(intent, guidelines).confidence <= 1
