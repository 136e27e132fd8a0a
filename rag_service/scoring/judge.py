"""The LLM judge: one chain-of-thought prompt (``judge_cot`` in the prompt registry) grades five
metrics; freshness and traceability stay local, they are measurements rather than judgements.

Scoring cannot import the prompt registry or the LLM client (same layer, independent), so the
caller renders the messages from ``judge_variables(inp)`` and passes any object with the two
methods of ``ChatModel``. A reply that is not valid JSON, misses a metric, holds a value outside
[0, 1], or a call that fails or runs out of time never raises: the result carries no scores and a
note saying why, and the caller keeps the local scores.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rag_service.domain import MetricName, MetricScore
from rag_service.scoring.evidence import ScoringInput

PROMPT_NAME = "judge_cot"
JUDGE_PREFIX = "llm-judge:"
JUDGED_METRICS: tuple[MetricName, ...] = ("faithfulness", "relevance", "correctness", "coverage", "consistency")

# The providers' Tier, repeated here because scoring may not import providers.
Tier = Literal["simple", "moderate", "complex"]
Message = dict[str, str]


class ChatModel(Protocol):
    """What the judge needs of an LLM (``rag_service.providers.llm.LLM`` has it)."""

    def model_for(self, tier: Tier) -> str: ...

    async def complete(self, messages: Sequence[Message], *, tier: Tier = "simple", max_tokens: int = 512,
                       temperature: float = 0.0, json_mode: bool = False) -> str: ...


# Strict on what is used (every metric present, a JSON number in [0, 1] or null, a reason);
# extra keys (a model that adds "confidence" or grades freshness too) are ignored.
class JudgedMetric(BaseModel):
    model_config = ConfigDict(strict=True)

    value: float | None = Field(ge=0, le=1)
    reason: str = Field(min_length=1, max_length=2000)


class JudgedScores(BaseModel):
    faithfulness: JudgedMetric
    relevance: JudgedMetric
    correctness: JudgedMetric
    coverage: JudgedMetric
    consistency: JudgedMetric


class JudgeReply(BaseModel):
    """The reply the prompt asks for."""

    reasoning_steps: list[str] = Field(default_factory=list, max_length=50)
    scores: JudgedScores


@dataclass(frozen=True)
class JudgeResult:
    """The judge's scores (empty when it failed) and, when it failed, why."""

    scorer: str
    scores: list[MetricScore] = field(default_factory=list)
    reasoning_steps: list[str] = field(default_factory=list)
    note: str | None = None

    @property
    def ok(self) -> bool:
        return self.note is None


# Our own delimiters inside untrusted text are defused, so a passage cannot close its section
# and pose as instructions outside it.
_TAGS = re.compile(r"<(/?)\s*(question|sub_questions|context|answer|reference)\b", re.I)


def _fence(text: str) -> str:
    return _TAGS.sub(lambda m: f"‹{m[1]}{m[2]}", text)


def _attribute(text: str) -> str:
    return " ".join(_fence(text).replace('"', "'").replace(">", "›").split())


def judge_variables(inp: ScoringInput) -> dict[str, Any]:
    """The ``judge_cot`` template's variables for one answer."""
    parts = [p for p in inp.parts if p.strip() and p.strip() != inp.question.strip()]
    return {
        "question": _fence(inp.question),
        "sub_questions": [_fence(p) for p in parts],
        "contexts": [{"n": i, "title": _attribute(c.title) if c.title else None, "text": _fence(c.text)}
                     for i, c in enumerate(inp.contexts, start=1)],
        "answer": _fence(inp.answer),
        "reference": _fence(inp.reference) if inp.reference and inp.reference.strip() else None,
    }


def parse_reply(reply: str) -> JudgeReply:
    """The validated reply; ValueError (or pydantic's ValidationError, a ValueError) otherwise."""
    text = reply.strip()
    start, end = text.find("{"), text.rfind("}")
    if start == -1 or end < start:
        raise ValueError("the reply holds no JSON object")
    return JudgeReply.model_validate_json(text[start:end + 1])


def _first_line(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        problems = [f"{'.'.join(str(p) for p in e['loc']) or 'reply'}: {e['msg']}" for e in exc.errors()[:3]]
        more = f" (+{exc.error_count() - 3} more)" if exc.error_count() > 3 else ""
        return "; ".join(problems) + more
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]


async def judge_scores(model: ChatModel, messages: Sequence[Message], *, tier: Tier = "simple",
                       budget_s: float, max_tokens: int = 1500) -> JudgeResult:
    """Grade with the LLM judge: one JSON-mode call within ``budget_s`` seconds."""
    if budget_s <= 0:
        raise ValueError("budget_s must be > 0 (seconds the judge may take)")
    try:
        scorer = f"{JUDGE_PREFIX}{model.model_for(tier)}"
    except Exception as exc:  # a misconfigured tier is a grading failure like any other
        return JudgeResult(scorer=f"{JUDGE_PREFIX}?", note=f"llm judge has no model for tier {tier}: {exc}")
    try:
        async with asyncio.timeout(budget_s):
            reply = await model.complete(messages, tier=tier, max_tokens=max_tokens, temperature=0.0, json_mode=True)
    except TimeoutError:
        return JudgeResult(scorer=scorer, note=f"llm judge timed out after {budget_s:g} s")
    except Exception as exc:  # provider errors and anything else: the local scores stand
        return JudgeResult(scorer=scorer, note=f"llm judge call failed: {_first_line(exc)}")
    try:
        parsed = parse_reply(reply)
    except ValueError as exc:
        return JudgeResult(scorer=scorer, note=f"llm judge reply invalid: {_first_line(exc)}")
    scores = [MetricScore(metric=name, value=getattr(parsed.scores, name).value,
                          reason=getattr(parsed.scores, name).reason.strip() or "no reason given", scorer=scorer)
              for name in JUDGED_METRICS]
    return JudgeResult(scorer=scorer, scores=scores, reasoning_steps=parsed.reasoning_steps)
