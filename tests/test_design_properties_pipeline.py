"""The design's properties (issue 14, part 6) that take the running pipeline or the database:

(a) a decomposed question always yields a valid plan (acyclic, every step reachable);
(f) low quality means exactly one review item;
(g) a review claim is exclusive.

(a) runs the real orchestrator over stand-ins of its collaborators (no database); (f) and (g) store
through the real repositories on this module's PostgreSQL database (tests/conftest.py), one
database for all examples, fresh ids per example. Every property runs at least 100 examples.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from hypothesis import assume, event, given
from hypothesis import strategies as st
from sqlalchemy import text

from rag_service.config import load_settings
from rag_service.db.engine import Database
from rag_service.db.repos import QueryLog
from rag_service.db.repos.reviews import ReviewRepository, ReviewScope
from rag_service.domain import (
    Caller,
    Claim,
    EvidenceContext,
    GuidelineSet,
    MetricScore,
    QueryRequest,
    TenantScope,
)
from rag_service.domain.review import FeedbackRequest, ReviewClaim, ReviewDecisionRequest
from rag_service.errors import ConflictError
from rag_service.pipeline.config import PipelineConfig
from rag_service.pipeline.evaluation import AnswerEvaluator, Graded
from rag_service.pipeline.intent import IntentParser
from rag_service.pipeline.orchestrator import QueryPipeline
from rag_service.pipeline.router import default_guidelines
from rag_service.review.gate import GatePolicy
from rag_service.review.service import ReviewService
from rag_service.scoring.combine import combine
from rag_service.scoring.evidence import ScoringInput
from tests.property_standins import (
    CLAUSES,
    METRIC_VALUES,
    NOW,
    PIPELINE,
    STORED,
    AnyCollection,
    Events,
    FixedGuidelines,
    MemoryLog,
    PassageRetriever,
    ScriptedIntentLLM,
    scored,
)
from tests.review.seed import seed_answer

# === (a) a decomposed question always yields a valid plan ==================================================

SPLITTERS = ("? ", "; ", " and also ", " as well as ", " and then ", "? And ")


@st.composite
def decomposed_questions(draw: st.DrawFn) -> str:
    clauses = draw(st.lists(st.sampled_from(CLAUSES), min_size=2, max_size=7))
    question = clauses[0]
    for clause in clauses[1:]:
        question += draw(st.sampled_from(SPLITTERS)) + clause
    question = question[0].upper() + question[1:] + draw(st.sampled_from(["?", "", "."]))
    assume(len(IntentParser().parse(question, NOW).sub_questions) >= 2)  # the rules decompose it
    return question


# The LLM's reading when the rules are unsure: its own sub-questions (dropped when unusable), or a
# reply that is not the JSON asked for (the rules' reading stands).
INTENT_REPLIES = st.none() | st.just("not json") | st.builds(
    lambda query_type, subs: json.dumps({"query_type": query_type, "sub_questions": subs}),
    st.sampled_from(["factual", "multi_step", "comparison", "summary", "temporal", "bogus"]),
    st.lists(st.sampled_from(CLAUSES) | st.text(max_size=40), max_size=8))


@st.composite
def guideline_sets_for_plans(draw: st.DrawFn) -> GuidelineSet:
    """The shipped guidelines, or the same with every route retrieving per part at any top_k."""
    shipped = default_guidelines()
    if draw(st.booleans()):
        return shipped
    split = [g.model_copy(update={"route": g.route.model_copy(update={
        "split_parts": True, "top_k": draw(st.integers(1, 50))})}) for g in shipped.guidelines]
    return GuidelineSet(guidelines=split, fallback=shipped.fallback.model_copy(update={"split_parts": True}))


def assert_valid_plan(steps: list[dict[str, Any]]) -> None:
    """The plan as the "plan" event describes it: unique ids, known dependencies, no cycle, every
    step reachable from a step with no dependencies, and every step leading to persistence (the
    one step nothing depends on), so no step's work is lost."""
    ids = [s["id"] for s in steps]
    deps = {s["id"]: set(s["depends_on"]) for s in steps}
    assert len(set(ids)) == len(ids), f"repeated step ids: {ids}"
    assert all(d <= set(ids) for d in deps.values()), f"unknown dependencies: {deps}"
    ordered: list[str] = []  # Kahn's algorithm: a cycle leaves steps that never become ready
    while len(ordered) < len(ids):
        ready = [i for i in ids if i not in ordered and deps[i] <= set(ordered)]
        assert ready, f"dependency cycle among {sorted(set(ids) - set(ordered))}"
        ordered += ready
    users = {i: {j for j in ids if i in deps[j]} for i in ids}
    reached, frontier = set(), [i for i in ids if not deps[i]]
    while frontier:
        step = frontier.pop()
        reached.add(step)
        frontier += [u for u in users[step] if u not in reached]
    assert reached == set(ids), f"unreachable steps: {sorted(set(ids) - reached)}"
    assert [i for i in ids if not users[i]] == ["persist"], "persistence must be the one final step"
    leads, frontier = set(), ["persist"]
    while frontier:
        step = frontier.pop()
        leads.add(step)
        frontier += [d for d in deps[step] if d not in leads]
    assert leads == set(ids), f"steps whose result nothing uses: {sorted(set(ids) - leads)}"


@PIPELINE
@given(question=decomposed_questions(), reply=INTENT_REPLIES, guidelines=guideline_sets_for_plans())
async def test_a_decomposed_question_always_yields_a_valid_plan(question: str, reply: str | None,
                                                                guidelines: GuidelineSet) -> None:
    """(a) A decomposed question always yields a valid plan: acyclic, every step reachable, every
    step run once; a route that splits gets one concurrent retrieval per part, all feeding generation."""
    retriever, events = PassageRetriever(), Events()
    pipeline = QueryPipeline(retriever=retriever, collections=AnyCollection(), guidelines=FixedGuidelines(guidelines),
                             query_log=MemoryLog(), intent_llm=ScriptedIntentLLM(reply) if reply else None,
                             config=PipelineConfig(retries=1, abstain_below=0.0))
    result = await pipeline.run(QueryRequest(question=question, collection="kb"), events, NOW)

    steps = events.one("plan")["steps"]
    assert_valid_plan(steps)
    ran = [r.id for r in result.steps]
    assert all(ran.count(s["id"]) == 1 for s in steps), ran
    assert not [r for r in result.steps if r.status == "failed"], result.steps
    decision = result.route
    event(f"route: {decision.guideline or 'fallback'} ({decision.route.action}), intent by {result.intent.parsed_by}")
    if decision.route.action != "answer":
        assert [s["id"] for s in steps] == ["persist"]
        return
    subs = result.intent.sub_questions
    parts = subs if decision.route.split_parts and len(subs) >= 2 else [result.intent.question]
    event(f"{len(parts)} retrieval part(s)")
    deps = {s["id"]: set(s["depends_on"]) for s in steps}
    retrieves = [s["id"] for s in steps if s["kind"] == "retrieve"]
    assert retrieves == [f"retrieve-{n}" for n in range(1, len(parts) + 1)]
    assert all(not deps[r] for r in retrieves)  # independent, so they run concurrently
    assert deps["generate"] == set(retrieves)
    assert sorted(r.query for r in retriever.requests) == sorted(p[:2000] for p in parts)


# === (f) low quality means exactly one review item ============================================================

@dataclass
class ScriptedEvaluator(AnswerEvaluator):
    """The real gate over given grades: ``values`` are the local scorer's, ``llm_values`` the LLM
    graders' (None: no LLM configured)."""

    values: Sequence[float | None] = ()
    llm_values: Sequence[float | None] | None = None
    verdicts: list[Graded] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.llm_values is not None:
            self.llm_grader = self._llm

    async def local(self, *, question: str, answer: str, contexts: Sequence[EvidenceContext],
                    parts: Sequence[str] = (), reference: str | None = None, claims: Sequence[Claim] | None = None,
                    now: datetime | None = None) -> tuple[ScoringInput, Graded]:
        inp = ScoringInput(question=question, answer=answer, contexts=contexts, parts=parts, now=now, claims=claims)
        graded = self.grade(scored(self.values, "local"))
        self.verdicts.append(graded)
        return inp, graded

    async def _llm(self, inp: ScoringInput, local: Sequence[MetricScore]) -> tuple[list[MetricScore], list[str]]:
        assert self.llm_values is not None
        combined = combine(local, scored(self.llm_values, "judge"), [])
        self.verdicts.append(self.grade(combined))
        return combined, []


async def review_rows(db: Database, query_id: uuid.UUID) -> list[Any]:
    async with db.connect() as conn:
        return (await conn.execute(text("SELECT id FROM review_items WHERE query_id = :q"), {"q": query_id})).all()


# Grades of any quality, and grades that are mostly good (so "not low" is common too).
GRADES = METRIC_VALUES | st.lists(st.none() | st.floats(0.75, 1), min_size=7, max_size=7)


@STORED
@given(values=GRADES, llm_values=st.none() | GRADES, mode=st.sampled_from(["deliver", "hold"]),
       ratings=st.lists(st.integers(1, 5), max_size=3))
async def test_low_quality_makes_exactly_one_review_item(database: Database, values: list[float | None],
                                                         llm_values: list[float | None] | None, mode: str,
                                                         ratings: list[int]) -> None:
    """(f) An answer whose grades are low (overall below the delivery threshold, or nothing could
    be judged) is stored with exactly one review item, the id the caller was given; the LLM
    grades after delivery and users' low ratings, racing each other, join that item instead of
    adding one. No trigger at all: no item."""
    policy = GatePolicy(metric_thresholds=load_settings().review_metric_thresholds, mode=mode)  # type: ignore[arg-type]
    evaluator = ScriptedEvaluator(policy=policy, values=values, llm_values=llm_values)
    pipeline = QueryPipeline(retriever=PassageRetriever(), collections=AnyCollection(),
                             guidelines=FixedGuidelines(default_guidelines()), query_log=QueryLog(database),
                             evaluator=evaluator, config=PipelineConfig(retries=1, abstain_below=0.0))
    collection = f"prop-{uuid.uuid4().hex[:10]}"
    result = await pipeline.run(QueryRequest(question="How long should the dough rise?", collection=collection),
                                now=NOW)
    assert result.evaluation is not None, result.steps  # graded: the property is about graded answers
    reviews = ReviewService(ReviewRepository(database), lease_s=60, expire_after_s=86_400)
    await asyncio.gather(pipeline.drain(10), *(reviews.feedback(Caller(role="admin"), result.query_id,
                                                                FeedbackRequest(rating=r)) for r in ratings))
    rows = await review_rows(database, result.query_id)

    gated = evaluator.verdicts[-1] if mode == "hold" else evaluator.verdicts[0]  # what the gate decided on
    low = gated.evaluation.overall is None or gated.evaluation.overall < policy.deliver_at
    # Hold mode queues on the grades the gate decided on; deliver mode on the local ones, then the LLM's.
    triggers = [gated] if mode == "hold" else evaluator.verdicts
    asked = any(g.verdict.needs_review for g in triggers) or any(r <= 2 for r in ratings)
    event(f"{mode}: {'low' if low else 'not low'}, {len(rows)} item(s)")
    if low:
        assert len(rows) == 1 and rows[0].id == result.review_id, (rows, result.review_id)
    assert len(rows) == (1 if asked else 0), (rows, evaluator.verdicts, ratings)


# === (g) a review claim is exclusive =========================================================================

APPROVE = ReviewDecisionRequest(decision="approved", category="answer_quality")
CLAIMABLE = {"claim": {"pending", "lapsed", "expired"}, "claim_next": {"pending", "lapsed"}}


async def arrange(db: Database, repo: ReviewRepository, review_id: uuid.UUID, state: str, holder: uuid.UUID) -> None:
    """Put the item in ``state``: pending, lapsed (claimed, lease run out), held (claimed, live),
    expired, or decided; ``holder`` is the earlier reviewer."""
    if state in ("lapsed", "held", "decided"):
        await repo.claim(review_id, holder, 60)
    async with db.begin() as conn:
        if state == "lapsed":
            await conn.execute(text("UPDATE review_items SET lease_expires_at = now() - interval '1 second' "
                                    "WHERE id = :id"), {"id": review_id})
        elif state == "expired":
            await conn.execute(text("UPDATE review_items SET status = 'expired' WHERE id = :id"), {"id": review_id})
    if state == "decided":
        await repo.decide(review_id, holder, APPROVE)


@STORED
@given(state=st.sampled_from(["pending", "lapsed", "held", "expired", "decided"]), racers=st.integers(2, 8),
       local_operator=st.booleans(), via=st.sampled_from(["claim", "claim_next"]))
async def test_a_review_claim_is_exclusive(database: Database, state: str, racers: int, local_operator: bool,
                                           via: str) -> None:
    """(g) Different reviewers claiming the same item at the same moment (each on a connection of
    its own): exactly one wins when the item can be claimed, none when another holds a live lease
    or it is decided; the others get a conflict (or nothing, from claim-next). Only the winner can
    then decide it."""
    repo = ReviewRepository(database)
    collection = f"claim-{uuid.uuid4().hex[:10]}"
    _, review_id = await seed_answer(database, collection=collection)
    assert review_id is not None
    holder = uuid.uuid4()
    await arrange(database, repo, review_id, state, holder)
    reviewers: list[uuid.UUID | None] = [uuid.uuid4() for _ in range(racers)]
    if local_operator:
        reviewers[0] = None  # the local operator (``ragsvc review``) races too
    if via == "claim":
        outcomes = await asyncio.gather(*(repo.claim(review_id, r, 60) for r in reviewers), return_exceptions=True)
    else:
        scope = ReviewScope(collections=TenantScope("default", (collection,)))
        outcomes = await asyncio.gather(*(repo.claim_next(r, 60, scope=scope) for r in reviewers),
                                        return_exceptions=True)
    wins = [o for o in outcomes if isinstance(o, ReviewClaim)]
    others = [o for o in outcomes if not isinstance(o, ReviewClaim)]
    assert all(isinstance(o, ConflictError) if via == "claim" else o is None for o in others), outcomes
    if via == "claim":  # how the others lost: on the row lock (the claims overlapped), or after a commit
        event(f"claim {state}: " + ("a claim lost on the row lock" if any("right now" in str(o) for o in others)
                                    else "every claim lost after a commit"))
    async with database.connect() as conn:
        row = (await conn.execute(text("SELECT status, claimed_by, lease_expires_at > now() AS live "
                                       "FROM review_items WHERE id = :id"), {"id": review_id})).one()
    if state not in CLAIMABLE[via]:
        assert wins == [], outcomes
        if state in ("held", "decided"):
            assert row.claimed_by == holder
        return
    assert len(wins) == 1, outcomes
    [winner] = wins
    assert winner.review_id == review_id and winner.claimed_by in reviewers
    assert row.status == "claimed" and row.claimed_by == winner.claimed_by and row.live
    losers = [r for r in reviewers if r != winner.claimed_by]
    decisions = await asyncio.gather(repo.decide(review_id, winner.claimed_by, APPROVE),
                                     *(repo.decide(review_id, r, APPROVE) for r in losers), return_exceptions=True)
    assert not isinstance(decisions[0], BaseException), decisions[0]
    assert all(isinstance(d, ConflictError) for d in decisions[1:]), decisions

