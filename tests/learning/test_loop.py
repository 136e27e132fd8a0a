"""The learning loop against a real PostgreSQL: versions and labels with their audit, the cache a
label move invalidates in another process, candidates from reviews, experiments with sticky
assignment, the guardrail, promotion and rollback."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator

import numpy as np
import pytest
import sqlalchemy.exc
from sqlalchemy import text

from rag_service.config import load_settings
from rag_service.db.engine import Database
from rag_service.db.repos.experiments import ExperimentRepository
from rag_service.db.repos.prompts import PromptRepository
from rag_service.db.repos.reviews import ReviewRepository
from rag_service.domain import Caller
from rag_service.domain.prompts import ExperimentRequest, NewVersionRequest
from rag_service.domain.review import ReviewDecisionRequest
from rag_service.errors import ConflictError, InvalidInputError, NotFoundError
from rag_service.learning.optimizer import rewriter
from rag_service.learning.service import LearningReviews, PromptService
from rag_service.prompts.registry import Prompt
from rag_service.providers.llm import make_llm
from rag_service.review.service import ReviewService
from tests.fake_openai import fake_openai
from tests.review.seed import seed_answer

ADMIN = Caller(role="admin")
EXTRACTIVE = "answer_extractive"


@pytest.fixture
async def db(databases) -> AsyncIterator[Database]:  # noqa: ANN001
    """A fresh migrated database per test: labels and experiments are global state."""
    url = databases.create()
    database = Database.from_settings(load_settings(database_url=url), url=url)
    yield database
    await database.dispose()


@pytest.fixture
async def service(db: Database) -> AsyncIterator[PromptService]:
    repo = PromptRepository(db, ttl_s=300)
    yield PromptService(repo, ExperimentRepository(db))
    await repo.close()


async def test_migration_makes_the_shipped_templates_and_guidelines_version_1_in_production(
        service: PromptService) -> None:
    summaries = {(s.kind, s.name): s for s in await service.prompts.summaries()}
    assert {("prompt", "answer_cot"), ("prompt", "judge_cot"), ("prompt", EXTRACTIVE), ("prompt", "prompt_optimizer"),
            ("guidelines", "router")} <= set(summaries)
    assert all(s.labels == {"production": 1} for s in summaries.values())
    version = await service.prompts.by_label("prompt", EXTRACTIVE, "production")
    assert version.source == "default" and version.parameters == {"max_sentences": 3, "support_ratio": 0.6}
    _, guidelines = await service.guidelines()
    assert any(g.name == "exact-lookup" for g in guidelines.guidelines)
    moves = await service.prompts.moves("prompt", "answer_cot")
    assert [(m.from_version, m.to_version, m.actor) for m in moves] == [(None, 1, "migration")]


async def test_versions_are_immutable_and_every_label_move_is_audited(service: PromptService, db: Database) -> None:
    v2 = await service.create(ADMIN, "prompt", EXTRACTIVE, NewVersionRequest(
        parameters={"max_sentences": 1}, note="one sentence", label="candidate"))
    assert (v2.version, v2.parent_version, v2.source, v2.labels) == (2, 1, "manual", ["candidate"])
    assert v2.body == (await service.prompts.version("prompt", EXTRACTIVE, 1)).body  # the parent's body
    with pytest.raises(sqlalchemy.exc.IntegrityError, match="immutable"):
        async with db.engine.begin() as conn:
            await conn.execute(text("UPDATE prompt_versions SET body = 'x' WHERE name = :n"), {"n": EXTRACTIVE})
    move = await service.move_label(ADMIN, "prompt", EXTRACTIVE, "production", 2, "try it")
    assert (move.from_version, move.to_version, move.actor, move.reason) == (1, 2, ADMIN.label, "try it")
    back = await service.rollback(ADMIN, "prompt", EXTRACTIVE)
    assert (back.from_version, back.to_version) == (2, 1)
    assert (await service.prompts.by_label("prompt", EXTRACTIVE, "production")).version == 1
    audit = [(m.label, m.from_version, m.to_version) for m in await service.prompts.moves("prompt", EXTRACTIVE)]
    assert audit == [("production", 2, 1), ("production", 1, 2), ("candidate", None, 2), ("production", None, 1)]
    with pytest.raises(ConflictError, match="no earlier version"):
        await service.rollback(ADMIN, "prompt", "judge_cot")
    diff = await service.diff("prompt", EXTRACTIVE, 1, 2)
    assert diff.parameters_changed == {"max_sentences": [3, 1]} and diff.body_diff == ""


async def test_invalid_versions_are_refused_with_what_to_fix(service: PromptService) -> None:
    with pytest.raises(InvalidInputError, match="section"):
        await service.create(ADMIN, "prompt", "answer_cot", NewVersionRequest(body="no sections here"))
    with pytest.raises(InvalidInputError, match="Jinja2"):
        await service.create(ADMIN, "prompt", "answer_cot", NewVersionRequest(body="[system]\n{{ broken"))
    with pytest.raises(InvalidInputError, match="max_sentence"):
        await service.create(ADMIN, "prompt", EXTRACTIVE, NewVersionRequest(parameters={"max_sentence": 2}))
    with pytest.raises(InvalidInputError, match="guidelines JSON"):
        await service.create(ADMIN, "guidelines", "router", NewVersionRequest(body='{"guidelines": "x"}'))
    with pytest.raises(NotFoundError):
        await service.create(ADMIN, "prompt", "no_such_prompt", NewVersionRequest())


async def test_a_label_moved_by_another_process_is_seen_at_once(service: PromptService, db: Database) -> None:
    """The cache holds entries for 300 s here, so only the NOTIFY can make this process see the
    move that a separate ``ragsvc`` process makes."""
    await service.create(ADMIN, "prompt", EXTRACTIVE, NewVersionRequest(parameters={"max_sentences": 2}))
    assert (await service.prompts.by_label("prompt", EXTRACTIVE, "production")).version == 1  # cached now
    await asyncio.sleep(0.5)  # the listener connects in the background
    env = {**os.environ, "RAGSVC_DATABASE_URL": db.url}
    moved = await asyncio.to_thread(subprocess.run, [
        sys.executable, "-m", "rag_service.cli", "prompts", "label", EXTRACTIVE, "production", "2",
        "--reason", "from another process"], env=env, capture_output=True, text=True, timeout=120)
    assert moved.returncode == 0, moved.stderr
    for _ in range(50):
        if (await service.prompts.by_label("prompt", EXTRACTIVE, "production")).version == 2:
            break
        await asyncio.sleep(0.1)
    assert (await service.prompts.by_label("prompt", EXTRACTIVE, "production")).version == 2
    assert service.prompts.invalidations >= 1


# --- experiments -------------------------------------------------------------------------------

async def _traffic(db: Database, experiment_id: uuid.UUID, versions: dict[str, int], means: dict[str, float],
                   n: int, *, queued: dict[str, float] | None = None, seed: int = 0) -> None:
    """Answers under the experiment, as the pipeline logs them: an answer row with the variant and
    a local score; a share of them queued for review."""
    rng = np.random.default_rng(seed)
    queued = queued or {}
    async with db.begin() as conn:
        for i in range(n):
            variant = ("control", "candidate")[i % 2]
            query_id = uuid.uuid4()
            overall = float(np.clip(rng.normal(means[variant], 0.1), 0, 1))
            await conn.execute(text("INSERT INTO queries (id, collection, question, outcome) "
                                    "VALUES (:id, 'kb', 'q', 'answered')"), {"id": query_id})
            await conn.execute(text(
                "INSERT INTO answers (id, query_id, text, generator, prompt_name, prompt_version, experiment_id, "
                "variant, timings_ms) VALUES (:id, :q, 'a', 'extractive', :name, :version, :e, :variant, "
                "CAST(:timings AS jsonb))"),
                {"id": uuid.uuid4(), "q": query_id, "name": EXTRACTIVE, "version": versions[variant],
                 "e": experiment_id, "variant": variant, "timings": f'{{"total": {50 + i % 7}}}'})
            await conn.execute(text(
                "INSERT INTO answer_scores (query_id, scorer, metrics, overall, needs_review) VALUES "
                "(:q, 'local-v1', CAST(:metrics AS jsonb), :overall, false)"),
                {"q": query_id, "overall": overall,
                 "metrics": f'{{"faithfulness": {{"value": {overall}, "reason": "r", "scorer": "local-v1"}}}}'})
            if rng.random() < queued.get(variant, 0.0):
                await conn.execute(text(
                    "INSERT INTO review_items (id, query_id, collection, trigger, tier) "
                    "VALUES (:id, :q, 'kb', 'evaluator', 'normal')"), {"id": uuid.uuid4(), "q": query_id})


async def _experiment(service: PromptService) -> uuid.UUID:
    await service.create(ADMIN, "prompt", EXTRACTIVE, NewVersionRequest(parameters={"max_sentences": 1},
                                                                        label="candidate"))
    experiment = await service.start_experiment(ADMIN, ExperimentRequest(name=EXTRACTIVE, share=0.5))
    assert (experiment.control_version, experiment.candidate_version) == (1, 2)
    return experiment.id


async def test_assignment_is_sticky_per_conversation_and_splits_traffic(service: PromptService) -> None:
    await _experiment(service)
    first = await service.choose(EXTRACTIVE, "conversation:c-1")
    again = [await service.choose(EXTRACTIVE, "conversation:c-1") for _ in range(5)]
    assert {c.variant for c in again} == {first.variant} and first.experiment_id is not None
    choices = [await service.choose(EXTRACTIVE, f"conversation:{i}") for i in range(400)]
    candidates = [c for c in choices if c.variant == "candidate"]
    assert 0.40 < len(candidates) / 400 < 0.60  # 0.5 +- 4 standard errors (0.025)
    assert {c.version.version for c in candidates} == {2}
    assert {c.version.version for c in choices if c.variant == "control"} == {1}
    with pytest.raises(ConflictError, match="already has a running experiment"):
        await service.start_experiment(ADMIN, ExperimentRequest(name=EXTRACTIVE))
    with pytest.raises(ConflictError, match="experiment"):
        await service.move_label(ADMIN, "prompt", EXTRACTIVE, "production", 2, "by hand")


async def test_a_winning_candidate_is_promoted_and_rollback_restores_production(
        service: PromptService, db: Database) -> None:
    experiment_id = await _experiment(service)
    with pytest.raises(ConflictError, match="has not won"):
        await service.promote(ADMIN, experiment_id)
    await _traffic(db, experiment_id, {"control": 1, "candidate": 2}, {"control": 0.70, "candidate": 0.80}, 300)
    report = await service.experiment_report(experiment_id)
    assert report.decision == "candidate_wins", report.decision_reason
    overall = report.comparisons[0]
    assert overall.metric == "overall" and overall.lower is not None and overall.lower > 0
    control, candidate = report.variants
    assert (control.answers, candidate.answers) == (150, 150) and candidate.overall_mean > control.overall_mean
    assert sum(candidate.overall_histogram) == 150 and control.latency_ms_p50 is not None
    move, after = await service.promote(ADMIN, experiment_id)
    assert (move.from_version, move.to_version, move.forced, move.experiment_id) == (1, 2, False, experiment_id)
    assert after.experiment.status == "promoted"
    choice = await service.choose(EXTRACTIVE, "conversation:anyone")
    assert (choice.version.version, choice.experiment_id) == (2, None)
    back = await service.rollback(ADMIN, "prompt", EXTRACTIVE, reason="regression in the wild")
    assert (back.from_version, back.to_version) == (2, 1)
    assert (await service.choose(EXTRACTIVE, "conversation:anyone")).version.version == 1


async def test_the_guardrail_stops_a_worse_candidate_and_returns_traffic_to_control(
        service: PromptService, db: Database) -> None:
    experiment_id = await _experiment(service)
    await _traffic(db, experiment_id, {"control": 1, "candidate": 2}, {"control": 0.75, "candidate": 0.75}, 400,
                   queued={"control": 0.05, "candidate": 0.40})
    report = await service.experiment_report(experiment_id)
    assert report.decision == "candidate_worse" and "review_rate" in report.decision_reason
    assert report.experiment.status == "stopped" and report.experiment.stop_reason.startswith("guardrail")
    choice = await service.choose(EXTRACTIVE, "conversation:c-1")
    assert (choice.version.version, choice.experiment_id) == (1, None)
    with pytest.raises(ConflictError, match="has not won"):
        await service.promote(ADMIN, experiment_id)
    move, _ = await service.promote(ADMIN, experiment_id, force=True)
    assert move.forced and "forced" in move.reason


# --- candidates from reviews -------------------------------------------------------------------

async def test_review_corrections_become_candidates_that_name_their_review(service: PromptService,
                                                                          db: Database) -> None:
    reviews = ReviewService(ReviewRepository(db), lease_s=60, expire_after_s=86_400)
    loop = LearningReviews(reviews, service)
    _, review_id = await seed_answer(db, prompt_name=EXTRACTIVE, prompt_version=1)
    assert review_id is not None
    await reviews.claim(ADMIN, review_id)
    for bad in ({"corrected_prompt": "no sections"}, {"corrected_routing": {"guideline": "no-such-rule"}}):
        with pytest.raises(InvalidInputError):
            await loop.decide(ADMIN, review_id, ReviewDecisionRequest(decision="approved", category="other", **bad))
    assert (await reviews.get(ADMIN, review_id)).decision is None  # refused before anything was stored
    decision = await loop.decide(ADMIN, review_id, ReviewDecisionRequest(
        decision="edited", category="routing", corrected_answer="Use the settings page [1].",
        corrected_prompt="[system]\nAnswer in one sentence.\n[user]\n{{ question }}",
        corrected_routing={"guideline": "exact-lookup"}))
    assert (decision.candidate_prompt_version, decision.candidate_guidelines_version) == (2, 2)
    prompt = await service.prompts.by_label("prompt", EXTRACTIVE, "candidate")
    assert (prompt.version, prompt.source, prompt.review_ids, prompt.parent_version) == (2, "review", [review_id], 1)
    guidelines = await service.prompts.by_label("guidelines", "router", "candidate")
    assert guidelines.review_ids == [review_id]
    rule = next(g for g in json.loads(guidelines.body)["guidelines"]
                if g["name"].startswith("review-"))
    assert rule["when"] == {"query_types": ["factual"]} and rule["route"]["top_k"] == 5
    # production is untouched until an experiment promotes the candidate
    assert (await service.guidelines())[0] == 1


async def test_propose_turns_recent_reviews_into_worked_examples(service: PromptService, db: Database) -> None:
    reviews = ReviewService(ReviewRepository(db), lease_s=60, expire_after_s=86_400)
    loop = LearningReviews(reviews, service)
    with pytest.raises(NotFoundError, match="no approved or edited reviews"):
        await loop.propose(ADMIN, "answer_cot")
    decided = []
    for question in ("How do I reset my password?", "how do I   reset my password?", "Where are invoices?"):
        _, review_id = await seed_answer(db, question=question)
        await reviews.claim(ADMIN, review_id)
        await reviews.decide(ADMIN, review_id, ReviewDecisionRequest(
            decision="edited", category="answer_quality", corrected_answer=f"Corrected: {question} [2]"))
        decided.append(review_id)
    candidate = await loop.propose(ADMIN, "answer_cot", last=10)
    assert candidate.labels == ["candidate"] and set(candidate.review_ids) == set(decided)
    assert candidate.body.count("Q: ") == 2  # the repeated question is taken once (the latest answer)
    assert "Where are invoices?" in candidate.body and "[2]" not in candidate.body.split("Worked examples")[1]
    rendered = Prompt(
        "answer_cot", candidate.version, candidate.body).render(
        passages=[], question="q", sub_questions=[], injection_flagged=False)
    assert "Worked examples" in rendered[0]["content"]


# --- what a stored version must never do --------------------------------------------------------

async def test_review_text_cannot_become_template_code(service: PromptService, db: Database) -> None:
    """Worked examples are spliced into template source: a question that tries to close a raw
    block or open an expression stays text, and templates render in Jinja2's sandbox."""
    reviews = ReviewService(ReviewRepository(db), lease_s=60, expire_after_s=86_400)
    loop = LearningReviews(reviews, service)
    payload = "What is {%endraw%}{{ 7*7 }}{%- endraw %}{{ cycler.__init__.__globals__.os.getpid() }}{%raw%}?"
    _, review_id = await seed_answer(db, question=payload, prompt_name="answer_cot")
    await reviews.claim(ADMIN, review_id)
    await reviews.decide(ADMIN, review_id, ReviewDecisionRequest(decision="approved", category="other"))
    candidate = await loop.propose(ADMIN, "answer_cot")
    system = Prompt("answer_cot", candidate.version, candidate.body).render(
        passages=[], question="q", sub_questions=[], injection_flagged=False)[0]["content"]
    assert "(( 7*7 ))" in system and "49" not in system and "getpid" in system  # the text, not its value
    assert "Q: What is" in system and "\n\nQ: " in system  # examples stand on lines of their own
    with pytest.raises(Exception, match="unsafe|not safely"):
        Prompt("x", 1, "[system]\n{{ cycler.__init__.__globals__.os.getpid() }}").render()


async def test_versions_that_would_fail_every_answer_are_refused(service: PromptService) -> None:
    for body, message in (("[system]\nHi {{ questoin }}\n[user]\n{{ question }} {{ passages }}", "questoin"),
                          ("[system]\nAnswer.\n[user]\n{{ question }}", "must use \\['passages'\\]")):
        with pytest.raises(InvalidInputError, match=message):
            await service.create(ADMIN, "prompt", "answer_cot", NewVersionRequest(body=body))
    for parameters, message in (({"max_sentences": 0}, "1 to 10"), ({"support_ratio": 5}, "0 to 1"),
                                ({"tier": "huge"}, "simple"), ({"temperature": 99}, "0 to 2"),
                                ({"max_sentences": True}, "1 to 10")):
        name = "answer_extractive" if "max_sentences" in parameters or "support_ratio" in parameters else "answer_cot"
        with pytest.raises(InvalidInputError, match=message):
            await service.create(ADMIN, "prompt", name, NewVersionRequest(parameters=parameters))


async def test_two_rollbacks_walk_back_two_moves(service: PromptService) -> None:
    for parameters in ({"max_sentences": 2}, {"max_sentences": 1}):
        version = await service.create(ADMIN, "prompt", EXTRACTIVE, NewVersionRequest(parameters=parameters))
        await service.move_label(ADMIN, "prompt", EXTRACTIVE, "production", version.version, None)
    assert [(await service.rollback(ADMIN, "prompt", EXTRACTIVE)).to_version for _ in range(2)] == [2, 1]
    with pytest.raises(ConflictError, match="no earlier version"):
        await service.rollback(ADMIN, "prompt", EXTRACTIVE)
    with pytest.raises(InvalidInputError, match="label"):
        await service.move_label(ADMIN, "prompt", EXTRACTIVE, "Not A Label", 1, None)


async def test_production_moves_only_by_promotion_while_an_experiment_runs(service: PromptService) -> None:
    experiment_id = await _experiment(service)
    with pytest.raises(ConflictError, match="experiment"):
        await service.create(ADMIN, "prompt", EXTRACTIVE, NewVersionRequest(label="production"))
    with pytest.raises(InvalidInputError, match="answer prompts"):
        await service.start_experiment(ADMIN, ExperimentRequest(name="judge_cot"))
    await service.stop_experiment(ADMIN, experiment_id, "pause")
    await service.move_label(ADMIN, "prompt", EXTRACTIVE, "production", 2, "by hand meanwhile")
    v3 = await service.create(ADMIN, "prompt", EXTRACTIVE, NewVersionRequest(parameters={"max_sentences": 2}))
    await service.move_label(ADMIN, "prompt", EXTRACTIVE, "production", v3.version, None)
    # The experiment compared version 2 with version 1; production is no longer version 1.
    with pytest.raises(ConflictError, match="not 1 as expected"):
        await service.promote(ADMIN, experiment_id, force=True)


async def test_a_candidate_that_declines_more_is_stopped(service: PromptService, db: Database) -> None:
    """Declining hard questions leaves only easy ones graded: the answered rate guards against a
    candidate that wins that way."""
    experiment_id = await _experiment(service)
    await _traffic(db, experiment_id, {"control": 1, "candidate": 2}, {"control": 0.75, "candidate": 0.80}, 400)
    async with db.begin() as conn:  # a third of the candidate's answers said the documents do not answer
        await conn.execute(text(
            "UPDATE queries SET outcome = 'no_answer' WHERE id IN (SELECT query_id FROM answers WHERE "
            "variant = 'candidate' AND experiment_id = :e ORDER BY created_at LIMIT 70)"), {"e": experiment_id})
        await conn.execute(text(
            "DELETE FROM answer_scores WHERE query_id IN (SELECT id FROM queries WHERE outcome = 'no_answer')"))
    report = await service.experiment_report(experiment_id)
    assert report.decision == "candidate_worse" and "answered_rate" in report.decision_reason


async def test_with_an_llm_propose_rewrites_the_template_from_feedback(service: PromptService,
                                                                       db: Database) -> None:
    """The analyse-feedback -> optimise-prompts step against a local OpenAI-compatible server: the
    optimizer prompt carries the reviewers' feedback, and a rewrite that is not a valid template
    leaves the examples-only candidate."""
    reviews = ReviewService(ReviewRepository(db), lease_s=60, expire_after_s=86_400)
    production = await service.prompts.by_label("prompt", "answer_cot", "production")
    rewritten = production.body.replace("Think step by step", "Be brief. Think step by step")
    _, review_id = await seed_answer(db, question="How do I reset my password?")
    await reviews.claim(ADMIN, review_id)
    await reviews.decide(ADMIN, review_id, ReviewDecisionRequest(
        decision="edited", category="answer_quality", corrected_answer="From the settings page [1].",
        feedback="Answers are far too long; one sentence is enough."))
    with fake_openai() as server:
        llm = make_llm(load_settings(llm_base_url=server.url, llm_model_simple="s", llm_model_complex="big",
                                     llm_timeout_s=5))
        optimizer = Prompt("prompt_optimizer", 1, (await service.prompts.by_label(
            "prompt", "prompt_optimizer", "production")).body)

        async def prompt() -> Prompt:
            return optimizer

        loop = LearningReviews(reviews, service, llm_rewrite=rewriter(llm, prompt))
        server.queue(rewritten, "[system]\n{{ not_a_variable }}")
        first = await loop.propose(ADMIN, "answer_cot")
        second = await loop.propose(ADMIN, "answer_cot")
        await llm.close()
    asked = json.dumps(server.requests[0])
    assert "far too long" in asked and "Think step by step" in asked
    assert first.source == "optimizer" and "Be brief." in first.body and first.review_ids == [review_id]
    assert second.source == "review" and "LLM rewrite failed" in second.note and "Be brief." not in second.body
