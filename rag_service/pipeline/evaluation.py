"""The online evaluator: grades an answer on the seven metrics (scoring/), then the tiered gate
(review/gate.py) decides whether it goes out, goes out and to a reviewer, or waits for one.

The local scores are computed inline (about a millisecond of text work; with
RAGSVC_EVAL_SIMILARITY one more embedding, of question and answer, for relevance). The LLM judge
and ragas, when an LLM is configured, are slow; ``llm_grader`` runs them, inline in hold mode (the
gate needs them) and otherwise after the answer was delivered.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np

from rag_service.domain import (
    Candidate,
    Claim,
    EvaluateRequest,
    Evaluation,
    EvaluationReport,
    EvidenceContext,
    GateVerdict,
    MetricScore,
)
from rag_service.pipeline.intent import IntentParser
from rag_service.prompts.registry import Prompt, PromptRegistry
from rag_service.review.gate import GatePolicy, gate
from rag_service.scoring.evidence import ScoringInput
from rag_service.scoring.freshness import DEFAULT_HALF_LIFE_DAYS
from rag_service.scoring.judge import ChatModel, judge_variables
from rag_service.scoring.llm_grading import llm_grade
from rag_service.scoring.local import DEFAULT_WEIGHTS, score_metrics
from rag_service.scoring.ragas_scores import RagasConfig

log = logging.getLogger(__name__)
# An answer with its handful of chunks (the pipeline's case) is about 3,000 characters and scores in
# about a millisecond; beyond this, scoring runs in a worker thread.
OFFLOAD_ABOVE_CHARS = 20_000

Embed = Callable[[Sequence[str]], Awaitable[np.ndarray]]
# (input, local scores) -> the combined scores and notes; scorer names say which parts judged.
LLMGrader = Callable[[ScoringInput, Sequence[MetricScore]], Awaitable[tuple[list[MetricScore], list[str]]]]


@dataclass(frozen=True)
class Graded:
    evaluation: Evaluation
    verdict: GateVerdict

    @property
    def report(self) -> EvaluationReport:
        return EvaluationReport.of(self.evaluation, self.verdict.needs_review, self.verdict.reasons)


def contexts_of(candidates: Sequence[Candidate]) -> list[EvidenceContext]:
    return [EvidenceContext(text=c.hit.text, effective_date=c.hit.document_date, title=c.hit.title)
            for c in candidates]


@dataclass
class AnswerEvaluator:
    weights: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_WEIGHTS))
    half_life_days: float = DEFAULT_HALF_LIFE_DAYS
    policy: GatePolicy = field(default_factory=GatePolicy)
    embed: Embed | None = None  # for relevance's question-answer cosine; None: lexical signals only
    llm_grader: LLMGrader | None = None

    @property
    def holds(self) -> bool:
        return self.policy.mode == "hold"

    async def similarity(self, question: str, answer: str) -> float | None:
        if self.embed is None or not answer.strip():
            return None
        try:
            vectors = await self.embed([question, answer])
        except Exception as exc:  # relevance keeps its lexical signals
            log.warning("no question-answer similarity for relevance: %s", exc)
            return None
        return float(np.dot(vectors[0], vectors[1]))

    async def local(self, *, question: str, answer: str, contexts: Sequence[EvidenceContext],
                    parts: Sequence[str] = (), reference: str | None = None, claims: Sequence[Claim] | None = None,
                    now: datetime | None = None) -> tuple[ScoringInput, Graded]:
        inp = ScoringInput(question=question, answer=answer, contexts=contexts, parts=parts, reference=reference,
                           now=now, claims=claims, similarity=await self.similarity(question, answer))
        size = len(answer) + sum(len(c.text) for c in contexts)
        if size > OFFLOAD_ABOVE_CHARS:
            # Long inputs (from /v1/evaluate) take tens of milliseconds or more of pure CPU: off the loop.
            scores = await asyncio.to_thread(score_metrics, inp, self.half_life_days)
        else:
            scores = score_metrics(inp, self.half_life_days)
        return inp, self.grade(scores)

    def grade(self, scores: Sequence[MetricScore]) -> Graded:
        evaluation = Evaluation.from_scores(scores, self.weights)
        return Graded(evaluation, gate(evaluation, self.policy))

    async def with_llm(self, inp: ScoringInput, local: Graded) -> tuple[Graded, list[str]] | None:
        """The grades with the LLM judge and ragas combined in; None without an LLM."""
        if self.llm_grader is None:
            return None
        scores, notes = await self.llm_grader(inp, local.evaluation.scores)
        return self.grade(scores), notes


async def evaluate_answer(evaluator: AnswerEvaluator, parser: IntentParser, request: EvaluateRequest,
                          now: datetime | None = None) -> EvaluationReport:
    """Grade an answer produced elsewhere with the same scorers the pipeline uses: the question is
    split into its parts by the same intent parser; the LLM judge and ragas join in when configured."""
    now = now or datetime.now(UTC)
    parts = parser.parse(request.question, now).sub_questions
    inp, graded = await evaluator.local(question=request.question, answer=request.answer,
                                        contexts=request.evidence(), parts=parts, reference=request.reference,
                                        now=now)
    combined = await evaluator.with_llm(inp, graded)
    return (combined[0] if combined else graded).report


def llm_grader(model: ChatModel | None, prompt: Prompt | Callable[[], Awaitable[Prompt]], ragas: RagasConfig | None,
               embed: Embed | None, budget_s: float) -> LLMGrader | None:
    """The LLM half of the evaluator: the ``judge_cot`` judge (when ``model`` is given; ``prompt``
    is its template, or a function reading the production version each time) and ragas
    (when configured), combined with the local scores (60% judge, 40% ragas where both scored;
    the local score, with the reason the judge gave none, elsewhere). None when neither is on."""
    if model is None and ragas is None:
        return None

    async def grade(inp: ScoringInput, local: Sequence[MetricScore]) -> tuple[list[MetricScore], list[str]]:
        messages = None
        if model is not None:
            template = prompt if isinstance(prompt, Prompt) else await prompt()
            try:
                messages = template.render(**judge_variables(inp))
            except Exception as exc:  # a stored version that fails to render must not cost the grade
                log.warning("judge prompt v%s failed to render (%s); using the shipped template", template.version, exc)
                messages = PromptRegistry().get(template.name).render(**judge_variables(inp))
        grades = await llm_grade(inp, model=model, messages=messages, ragas_config=ragas, embed=embed,
                                 budget_s=budget_s)
        return grades.combined(local), grades.notes

    return grade
