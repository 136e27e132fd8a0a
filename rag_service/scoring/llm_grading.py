"""The LLM half of the evaluator: the judge and ragas, concurrently, within one time budget.

The caller (the pipeline, which may import the prompt registry) renders the judge's messages:

    messages = registry.get("judge_cot").render(**judge_variables(inp))
    grades = await llm_grade(inp, model=llm, messages=messages, ragas_config=..., embed=..., budget_s=...)
    scores = grades.combined(local_scores)   # all seven metrics; grades.notes say what was skipped
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from rag_service.domain import MetricScore
from rag_service.scoring.combine import combine
from rag_service.scoring.evidence import ScoringInput
from rag_service.scoring.judge import ChatModel, JudgeResult, Message, Tier, judge_scores
from rag_service.scoring.ragas_scores import Embed, RagasConfig, RagasResult, ragas_scores


@dataclass(frozen=True)
class LLMGrades:
    """What the judge and ragas scored (not yet combined with the local scores), and notes on
    what they could not score and why."""

    judge: list[MetricScore] = field(default_factory=list)
    ragas: list[MetricScore] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    judge_note: str | None = None  # why the judge gave nothing (None: it scored, or was not asked)

    @property
    def scores(self) -> list[MetricScore]:
        return [*self.judge, *self.ragas]

    def combined(self, local: Sequence[MetricScore]) -> list[MetricScore]:
        """All seven metrics: judge and ragas blended where both scored, the local score elsewhere."""
        return combine(local, self.judge, self.ragas, [self.judge_note] if self.judge_note else ())


async def llm_grade(inp: ScoringInput, *, model: ChatModel | None, messages: Sequence[Message] | None,
                    ragas_config: RagasConfig | None, embed: Embed | None, budget_s: float,
                    tier: Tier = "simple") -> LLMGrades:
    """Grade with the LLM judge (when ``model`` is given) and ragas (when ``ragas_config`` is),
    concurrently, each within ``budget_s`` seconds. Grading failures are notes, never exceptions."""
    if budget_s <= 0:
        raise ValueError("budget_s must be > 0 (seconds the LLM graders may take)")
    if model is not None and not messages:
        raise ValueError("the judge needs its rendered messages (judge_cot with judge_variables(inp))")

    async def judged() -> JudgeResult | None:
        return None if model is None else await judge_scores(model, messages or (), tier=tier, budget_s=budget_s)

    async def checked() -> RagasResult | None:
        return None if ragas_config is None else await ragas_scores(inp, ragas_config, embed=embed,
                                                                    budget_s=budget_s)

    judge, ragas = await asyncio.gather(judged(), checked())
    notes = [n for n in ([judge.note] if judge else []) if n] + (ragas.notes if ragas else [])
    return LLMGrades(judge=judge.scores if judge else [], ragas=ragas.scores if ragas else [], notes=notes,
                     judge_note=judge.note if judge else None)
