"""The review queue on a real PostgreSQL: one item per answer however it is triggered, claims and
leases under concurrency, decisions and golden items, filters, upkeep, feedback and statistics."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from rag_service.config import load_settings
from rag_service.db.engine import Database
from rag_service.db.repos.reviews import ReviewRepository, ReviewScope, enqueue
from rag_service.domain import Caller, ReviewTrigger, TenantScope
from rag_service.domain.review import FeedbackRequest, ReviewClaim, ReviewDecisionRequest, ReviewFilters
from rag_service.errors import ConflictError, NotFoundError
from rag_service.review.service import ReviewService
from tests.review.seed import add_chunk, backdate, citation, seed_answer

ALICE, BOB = uuid.uuid4(), uuid.uuid4()
APPROVE = ReviewDecisionRequest(decision="approved", category="answer_quality")


def fresh() -> str:
    return f"c-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="module")
def repo(database: Database) -> ReviewRepository:
    return ReviewRepository(database)


def service(repo: ReviewRepository, **kwargs: object) -> ReviewService:
    return ReviewService(repo, **{"lease_s": 60.0, "expire_after_s": 30 * 86_400.0, **kwargs})  # type: ignore[arg-type]


async def rows_for(db: Database, query_id: uuid.UUID) -> list:
    async with db.connect() as conn:
        return (await conn.execute(text("SELECT * FROM review_items WHERE query_id = :q"), {"q": query_id})).all()


# --- one item per answer ---------------------------------------------------------------------------

REASONS = st.sampled_from(["overall: 0.70 < 0.80", "faithfulness: 0.42 < 0.80", "user feedback: rating 1/5",
                           "user feedback: rating 2/5: wrong year", "relevance: 0.50 < 0.60"])
TRIGGERS = st.builds(
    ReviewTrigger, source=st.sampled_from(["evaluator", "feedback"]), tier=st.sampled_from(["high", "normal"]),
    reasons=st.lists(REASONS, max_size=3).map(tuple),
    flagged=st.lists(st.sampled_from(["faithfulness", "relevance", "coverage"]), max_size=2).map(tuple),
    overall=st.none() | st.floats(0, 1))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sequential=st.lists(TRIGGERS, max_size=4), concurrent=st.lists(TRIGGERS, max_size=5))
def test_any_mix_of_triggers_makes_one_item_with_every_reason(migrated_url: str, sequential: list[ReviewTrigger],
                                                              concurrent: list[ReviewTrigger]) -> None:
    triggers = sequential + concurrent
    if not triggers:
        return

    async def run() -> None:
        db = Database.from_settings(load_settings(database_url=migrated_url), url=migrated_url)
        try:
            query_id, _ = await seed_answer(db, collection="prop", queue=False)

            async def trigger(t: ReviewTrigger) -> uuid.UUID:
                async with db.begin() as conn:
                    return await enqueue(conn, query_id=query_id, collection="prop", question_hash="h", trigger=t)

            ids = [await trigger(t) for t in sequential]
            ids += await asyncio.gather(*(trigger(t) for t in concurrent))
            rows = await rows_for(db, query_id)
        finally:
            await db.dispose()
        assert len(rows) == 1 and set(ids) == {rows[0].id}
        row = rows[0]
        assert row.reasons == sorted({r for t in triggers for r in t.reasons})
        assert row.metrics == sorted({m for t in triggers for m in t.flagged})
        assert row.tier == ("high" if any(t.tier == "high" for t in triggers) else "normal")
        assert set(row.trigger.split("+")) == {t.source for t in triggers}

    asyncio.run(run())


# --- claims ----------------------------------------------------------------------------------------

async def test_two_reviewers_racing_for_one_item_one_wins(database: Database, repo: ReviewRepository) -> None:
    for _ in range(8):
        _, review_id = await seed_answer(database, collection=fresh())
        results = await asyncio.gather(repo.claim(review_id, ALICE, 60), repo.claim(review_id, BOB, 60),
                                       return_exceptions=True)
        wins = [r for r in results if isinstance(r, ReviewClaim)]
        losses = [r for r in results if isinstance(r, ConflictError)]
        assert len(wins) == 1 and len(losses) == 1, results
        async with database.connect() as conn:
            holder = (await conn.execute(text("SELECT claimed_by FROM review_items WHERE id = :id"),
                                         {"id": review_id})).scalar_one()
        assert holder == wins[0].claimed_by


async def test_concurrent_claim_next_hands_out_different_items(database: Database, repo: ReviewRepository) -> None:
    collection = fresh()
    items = {(await seed_answer(database, collection=collection))[1] for _ in range(3)}
    scope = ReviewScope(collections=TenantScope("default", (collection,)))
    claims = await asyncio.gather(*(repo.claim_next(uuid.uuid4(), 60, scope=scope) for _ in range(5)))
    taken = [c.review_id for c in claims if c is not None]
    assert sorted(map(str, taken)) == sorted(map(str, items))  # each once, and two callers got nothing
    assert await repo.claim_next(ALICE, 60, scope=scope) is None


async def test_claim_next_takes_the_highest_priority_item(database: Database, repo: ReviewRepository) -> None:
    collection = fresh()
    await seed_answer(database, collection=collection, overall=0.75)
    _, urgent = await seed_answer(database, collection=collection, overall=0.3, tier="high")
    await seed_answer(database, collection=collection, overall=0.62)
    claim = await repo.claim_next(ALICE, 60, scope=ReviewScope(collections=TenantScope("default", (collection,))))
    assert claim is not None and claim.review_id == urgent and claim.claimed_by == ALICE


async def test_a_lapsed_lease_can_be_claimed_by_another(database: Database, repo: ReviewRepository) -> None:
    _, review_id = await seed_answer(database, collection=fresh())
    first = await repo.claim(review_id, ALICE, 0.3)
    with pytest.raises(ConflictError) as held:
        await repo.claim(review_id, BOB, 60)
    assert held.value.fields["claimed_by"] == str(ALICE)
    assert held.value.fields["lease_expires_at"] == first.lease_expires_at.isoformat()
    await asyncio.sleep(0.5)
    second = await repo.claim(review_id, BOB, 60)
    assert second.claimed_by == BOB and second.lease_expires_at > first.lease_expires_at
    with pytest.raises(ConflictError, match=f"claimed by reviewer key {BOB}"):
        await repo.decide(review_id, ALICE, APPROVE)


async def test_claiming_again_extends_ones_own_lease(database: Database, repo: ReviewRepository) -> None:
    _, review_id = await seed_answer(database, collection=fresh())
    first = await repo.claim(review_id, None, 30)  # the local operator
    again = await repo.claim(review_id, None, 600)
    assert again.claimed_at == first.claimed_at and again.lease_expires_at > first.lease_expires_at
    with pytest.raises(ConflictError, match="claimed by the local operator"):
        await repo.claim(review_id, ALICE, 60)


async def test_unknown_and_out_of_scope_items_are_not_found(database: Database, repo: ReviewRepository) -> None:
    _, review_id = await seed_answer(database, collection=fresh())
    elsewhere = ReviewScope(collections=TenantScope("default", ("elsewhere",)))
    for call in (repo.get(uuid.uuid4()), repo.claim(uuid.uuid4(), ALICE, 60),
                 repo.decide(uuid.uuid4(), ALICE, APPROVE), repo.get(review_id, scope=elsewhere),
                 repo.claim(review_id, ALICE, 60, scope=elsewhere)):
        with pytest.raises(NotFoundError):
            await call


# --- decisions -------------------------------------------------------------------------------------

async def test_a_decision_needs_the_deciders_live_claim(database: Database, repo: ReviewRepository) -> None:
    _, review_id = await seed_answer(database, collection=fresh())
    with pytest.raises(ConflictError, match="claim review item .* before deciding"):
        await repo.decide(review_id, ALICE, APPROVE)
    await repo.claim(review_id, ALICE, 60)
    with pytest.raises(ConflictError, match=f"claimed by reviewer key {ALICE}"):
        await repo.decide(review_id, BOB, APPROVE)
    decision = await repo.decide(review_id, ALICE, APPROVE)
    assert decision.reviewer_key_id == ALICE and decision.decision == "approved"
    with pytest.raises(ConflictError, match="already decided"):
        await repo.decide(review_id, ALICE, APPROVE)
    with pytest.raises(ConflictError, match="already decided"):
        await repo.claim(review_id, ALICE, 60)


async def test_a_lapsed_claim_cannot_decide(database: Database, repo: ReviewRepository) -> None:
    _, review_id = await seed_answer(database, collection=fresh())
    await repo.claim(review_id, ALICE, 0.2)
    await asyncio.sleep(0.4)
    with pytest.raises(ConflictError, match="claim review item"):
        await repo.decide(review_id, ALICE, APPROVE)


async def golden_rows(db: Database, review_id: uuid.UUID) -> list:
    async with db.connect() as conn:
        return (await conn.execute(text("SELECT * FROM golden_items WHERE review_id = :id"), {"id": review_id})).all()


async def test_approved_and_edited_answers_become_golden_items(database: Database, repo: ReviewRepository) -> None:
    collection = fresh()
    cited = [citation(1, uuid.uuid4(), uuid.uuid4())]
    _, approved = await seed_answer(database, collection=collection, citations=cited, prompt_version=3,
                                    question="How do I reset my password?")
    _, edited = await seed_answer(database, collection=collection, citations=cited)
    _, rejected = await seed_answer(database, collection=collection, citations=cited)
    for review_id in (approved, edited, rejected):
        await repo.claim(review_id, ALICE, 60)
    await asyncio.sleep(0.2)

    decision = await repo.decide(approved, ALICE, APPROVE)
    assert decision.prompt_name == "answer_cot" and decision.prompt_version == 3
    assert decision.time_to_review_s is not None and 0.2 <= decision.time_to_review_s < 30
    [gold] = await golden_rows(database, approved)
    assert decision.golden_item_id == gold.id and gold.source == "approved" and gold.collection == collection
    assert gold.question == "How do I reset my password?"
    assert gold.answer == "Reset it from the settings page [1]." and gold.citations == cited

    fix = ReviewDecisionRequest(decision="edited", category="relevance", corrected_answer="Use the reset link [1].",
                                corrected_routing={"guideline": "exact-lookup"}, feedback="too vague",
                                corrected_prompt="Be specific.", time_to_review_s=42)
    decision = await repo.decide(edited, ALICE, fix)
    assert decision.time_to_review_s == 42 and decision.corrected_routing == {"guideline": "exact-lookup"}
    [gold] = await golden_rows(database, edited)
    assert gold.answer == "Use the reset link [1]." and gold.source == "edited"

    decision = await repo.decide(rejected, ALICE, ReviewDecisionRequest(decision="rejected", category="routing"))
    assert decision.golden_item_id is None and await golden_rows(database, rejected) == []
    statuses = {i.id: i.status for i in (await repo.list(ReviewFilters(collection=collection)))[0]}
    assert statuses == {approved: "approved", edited: "edited", rejected: "rejected"}


def test_an_edit_needs_a_corrected_answer_and_only_an_edit_takes_one() -> None:
    with pytest.raises(ValueError, match="corrected_answer is required"):
        ReviewDecisionRequest(decision="edited", category="other")
    with pytest.raises(ValueError, match="corrected_answer is required"):
        ReviewDecisionRequest(decision="edited", category="other", corrected_answer="   ")
    with pytest.raises(ValueError, match="only taken with decision edited"):
        ReviewDecisionRequest(decision="approved", category="other", corrected_answer="x")


# --- the detail view ---------------------------------------------------------------------------------

async def test_the_detail_has_what_a_reviewer_needs(database: Database, repo: ReviewRepository) -> None:
    collection = fresh()
    chunk_id, document_id = await add_chunk(database, collection, "Reset it from the settings page. Then log in.")
    gone = uuid.uuid4()
    _, review_id = await seed_answer(
        database, collection=collection, citations=[citation(1, chunk_id, document_id)],
        context=[{"n": 2, "chunk_id": str(gone), "score": 0.4}, {"n": 1, "chunk_id": str(chunk_id), "score": 0.9}],
        flagged=["faithfulness"], reasons=["overall: 0.50 < 0.80", "faithfulness: 0.40 < 0.80"])
    item = await repo.get(review_id)
    assert item.question == "How do I reset my password?" and item.answer.text.startswith("Reset it")
    assert item.citations[0].chunk_id == chunk_id and item.citations[0].end_char == 32
    assert [(c.n, c.chunk_id) for c in item.context] == [(1, chunk_id), (2, gone)]
    assert item.context[0].text.startswith("Reset it") and item.context[0].document_id == document_id
    assert item.context[1].text is None  # the chunk is gone: shown as such, not dropped
    assert item.route["guideline"] == "default-answer" and item.intent["query_type"] == "factual"
    [scores] = item.scores
    assert scores.scorer == "local-v1" and scores.metrics["faithfulness"].reason == "faithfulness was 0.4"
    assert item.metrics == ["faithfulness"] and item.reasons == sorted(item.reasons) and item.decision is None
    assert item.status == "pending" and item.claimed_by is None and item.traffic == 0  # no question hash


# --- listing, filters, upkeep --------------------------------------------------------------------------

async def test_filters_and_pages(database: Database, repo: ReviewRepository) -> None:
    collection = fresh()
    _, a = await seed_answer(database, collection=collection, flagged=["faithfulness"],
                             reasons=["faithfulness: 0.40 < 0.80", "100%_sure"], prompt_version=1)
    _, b = await seed_answer(database, collection=collection, flagged=["relevance"],
                             reasons=["relevance: 0.50 < 0.60"], prompt_version=2, tier="high")
    _, c = await seed_answer(database, collection=collection, reasons=["user feedback: rating 1/5"],
                             prompt_version=2)
    await repo.claim(c, ALICE, 60)

    async def ids(**filters: object) -> set[uuid.UUID]:
        items, count = await repo.list(ReviewFilters(collection=collection, **filters))
        assert count == len(items)
        return {i.id for i in items}

    assert await ids() == {a, b, c}
    assert await ids(metric="faithfulness") == {a}
    assert await ids(reason="RELEVANCE") == {b}
    assert await ids(reason="0%_") == {a}  # LIKE wildcards are literal
    assert await ids(reason="%") == {a} and await ids(reason="_") == {a}
    assert await ids(prompt_name="answer_cot", prompt_version=2) == {b, c}
    assert await ids(status="claimed") == {c} and await ids(status="pending") == {a, b}
    page, count = await repo.list(ReviewFilters(collection=collection), limit=2, offset=2)
    assert count == 3 and len(page) == 1
    assert (await repo.list(ReviewFilters(collection=collection), limit=2))[0][0].id == b  # high tier first
    assert (await repo.list(ReviewFilters(collection=collection), scope=ReviewScope(
        collections=TenantScope("default", ("elsewhere",)))))[1] == 0


async def test_upkeep_releases_lapsed_claims_and_expires_old_items(database: Database,
                                                                   repo: ReviewRepository) -> None:
    collection = fresh()
    _, old = await seed_answer(database, collection=collection)
    _, young = await seed_answer(database, collection=collection)
    _, lapsed = await seed_answer(database, collection=collection)
    _, decided = await seed_answer(database, collection=collection)
    for review_id in (old, decided):
        await backdate(database, review_id, 31 * 86_400)
    await repo.claim(decided, ALICE, 60)
    await repo.decide(decided, ALICE, APPROVE)
    await repo.claim(lapsed, ALICE, 0.2)
    await asyncio.sleep(0.4)

    page = await service(repo).list(Caller(role="admin"), ReviewFilters(collection=collection))
    status = {i.id: i.status for i in page.data}
    assert status == {old: "expired", young: "pending", lapsed: "pending", decided: "approved"}
    assert (await repo.housekeep(30 * 86_400)).expired == 0  # nothing left to do
    assert await repo.claim_next(BOB, 60, ReviewFilters(collection=collection)) is not None
    # An expired item can still be claimed explicitly (a reviewer may look at it anyway).
    assert (await repo.claim(old, BOB, 60)).claimed_by == BOB


# --- feedback ----------------------------------------------------------------------------------------

async def test_low_ratings_queue_the_answer(database: Database, repo: ReviewRepository) -> None:
    reviews = service(repo, mask=lambda s: s.replace("555-0100", "[PHONE]"))
    local = Caller(role="admin")
    collection = fresh()
    liked, _ = await seed_answer(database, collection=collection, queue=False, overall=0.9)
    receipt = await reviews.feedback(local, liked, FeedbackRequest(rating=4, comment="fine"))
    assert receipt.review_id is None and await rows_for(database, liked) == []

    meh, _ = await seed_answer(database, collection=collection, queue=False, overall=0.85)
    receipt = await reviews.feedback(local, meh, FeedbackRequest(rating=2, comment="call me at 555-0100, wrong"))
    [row] = await rows_for(database, meh)
    assert receipt.review_id == row.id and row.trigger == "feedback" and row.tier == "normal"
    assert row.reasons == ["user feedback: rating 2/5: call me at [PHONE], wrong"] and row.overall == 0.85
    async with database.connect() as conn:
        stored = (await conn.execute(text("SELECT rating, comment FROM answer_feedback WHERE query_id = :q"),
                                     {"q": meh})).one()
    assert stored.rating == 2 and "555-0100" not in stored.comment

    # Feedback on an answer the evaluator queued joins its item and raises its tier.
    queued, review_id = await seed_answer(database, collection=collection)
    receipt = await reviews.feedback(local, queued, FeedbackRequest(rating=1))
    [row] = await rows_for(database, queued)
    assert receipt.review_id == review_id == row.id and row.tier == "high" and row.trigger == "evaluator+feedback"
    assert "user feedback: rating 1/5" in row.reasons

    with pytest.raises(NotFoundError):
        await reviews.feedback(local, uuid.uuid4(), FeedbackRequest(rating=1))


# --- statistics --------------------------------------------------------------------------------------

async def test_stats_on_a_known_set(database: Database, repo: ReviewRepository) -> None:
    collection = fresh()
    # Decided items: (flagged metrics, decision, category, prompt version)
    decided = [(["faithfulness"], "rejected", "answer_quality", 1), (["faithfulness"], "edited", "answer_quality", 1),
               (["faithfulness", "relevance"], "approved", "relevance", 2), ([], "approved", "routing", 2),
               ([], "rejected", "routing", 2), (["relevance"], "approved", "other", 2)]
    for flagged, decision, category, version in decided:
        _, review_id = await seed_answer(database, collection=collection, flagged=flagged, prompt_version=version)
        await repo.claim(review_id, ALICE, 60)
        await repo.decide(review_id, ALICE, ReviewDecisionRequest(
            decision=decision, category=category, corrected_answer="better" if decision == "edited" else None))
    for age in (100, 200, 300, 1_000):
        _, review_id = await seed_answer(database, collection=collection)
        await backdate(database, review_id, age)
    await repo.claim(review_id, BOB, 60)  # claimed items are still open

    stats = await service(repo).stats(Caller(role="reviewer", key_id=ALICE, collections=(collection,)))
    assert stats.by_status == {"pending": 3, "claimed": 1, "approved": 3, "rejected": 2, "edited": 1, "expired": 0}
    # numpy's linear interpolation over [100, 200, 300, 1000] (+ the seconds the test has taken)
    assert stats.open_age_s is not None
    assert 250 <= stats.open_age_s.p50 < 260 and 895 <= stats.open_age_s.p95 < 905
    by_category = stats.decisions_by_category
    assert by_category["answer_quality"].model_dump() == {"approved": 0, "rejected": 1, "edited": 1, "total": 2}
    assert by_category["routing"].total == 2 and by_category["other"].approved == 1
    by_prompt = {p.prompt_version: p for p in stats.decisions_by_prompt}
    assert by_prompt[1].total == 2 and by_prompt[1].approved == 0
    assert (by_prompt[2].approved, by_prompt[2].rejected, by_prompt[2].total) == (3, 1, 4)
    # faithfulness flagged: T T T F F F; corrected (rejected/edited): T T F F T F
    # p_o = 4/6; p_e = 0.5 * 0.5 + 0.5 * 0.5 = 0.5; kappa = (2/3 - 1/2) / (1/2) = 1/3
    faithfulness = stats.agreement["faithfulness"]
    assert faithfulness.kappa == pytest.approx(1 / 3) and faithfulness.n == 6
    assert faithfulness.flagged == 3 and faithfulness.corrected == 3
    # relevance flagged: F F T F F T against T T F F T F: p_o = 1/6, p_e = 1/3*1/2 + 2/3*1/2 = 1/2 -> -2/3
    assert stats.agreement["relevance"].kappa == pytest.approx(-2 / 3)
    # coverage is never flagged, and the reviewers corrected half: p_e = 0.5, p_o = 0.5 -> 0
    assert stats.agreement["coverage"].kappa == pytest.approx(0.0)


async def test_stats_of_an_empty_scope_are_undefined_not_zero(repo: ReviewRepository) -> None:
    stats = await service(repo).stats(Caller(role="reviewer", key_id=ALICE, collections=(fresh(),)))
    assert set(stats.by_status.values()) == {0} and stats.open_age_s is None
    assert all(a.kappa is None and a.n == 0 for a in stats.agreement.values())
    assert stats.decisions_by_prompt == [] and all(c.total == 0 for c in stats.decisions_by_category.values())
