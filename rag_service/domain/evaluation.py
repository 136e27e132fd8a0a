"""An answer's grades: seven metrics, each a value in [0, 1] or None ("could not judge"), with the
reason and the scorer that produced it, and a weighted overall score."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

MetricName = Literal["faithfulness", "relevance", "correctness", "coverage", "consistency", "freshness",
                     "traceability"]
METRICS: tuple[MetricName, ...] = get_args(MetricName)


class MetricScore(BaseModel):
    model_config = ConfigDict(frozen=True)

    metric: MetricName
    value: float | None = Field(ge=0, le=1, description="None: the scorer could not judge this answer.")
    reason: str = Field(min_length=1, description="One sentence on why the value is what it is.")
    scorer: str = Field(min_length=1, description="What produced it: local-v1, llm-judge:<model>, ragas:<Metric>.")


class Evaluation(BaseModel):
    """The scores of one answer. ``overall`` is the weighted mean of the metrics that could be
    judged (their weights renormalised); None when none could."""

    model_config = ConfigDict(frozen=True)

    scores: tuple[MetricScore, ...]
    overall: float | None = Field(ge=0, le=1)

    @model_validator(mode="after")
    def _one_score_per_metric(self) -> Evaluation:
        names = [s.metric for s in self.scores]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"each metric is scored once; repeated: {repeated}")
        return self

    @classmethod
    def from_scores(cls, scores: Sequence[MetricScore], weights: Mapping[str, float]) -> Evaluation:
        if any(w < 0 for w in weights.values()):
            raise ValueError("metric weights must be >= 0")
        judged = [(s.value, weights.get(s.metric, 0.0)) for s in scores if s.value is not None]
        total = sum(w for _, w in judged)
        # Each weight as its share of the total first: v * w / total underflows to 0 when the
        # weights are tiny (a subnormal weight on the one judged metric gave 0.0 for a 0.5).
        overall = sum(v * (w / total) for v, w in judged) if total > 0 else None
        return cls(scores=tuple(scores), overall=None if overall is None else round(overall, 4))

    def get(self, metric: MetricName) -> MetricScore | None:
        return next((s for s in self.scores if s.metric == metric), None)


class MetricValue(BaseModel):
    """One metric as the API shows it (the metric is the key it is listed under)."""

    value: float | None = Field(ge=0, le=1, description="None: the scorer could not judge this answer.")
    reason: str
    scorer: str


class EvaluationReport(BaseModel):
    """An answer's grades as every interface shows them (``/v1/query``'s ``evaluation``, the
    ``evaluation`` SSE event, ``POST /v1/evaluate``, ``ragsvc ask``)."""

    overall: float | None = Field(ge=0, le=1, description="Weighted mean of the metrics that could be judged.")
    metrics: dict[MetricName, MetricValue] = Field(description="All seven metrics.")
    needs_review: bool = Field(description="Below the delivery threshold: a reviewer will look at it.")
    reasons: list[str] = Field(default_factory=list,
                               description='Why it needs review, e.g. "faithfulness: 0.42 < 0.80".')

    @classmethod
    def of(cls, evaluation: Evaluation, needs_review: bool, reasons: Sequence[str]) -> EvaluationReport:
        return cls(overall=evaluation.overall, needs_review=needs_review, reasons=list(reasons),
                   metrics={s.metric: MetricValue(value=s.value, reason=s.reason, scorer=s.scorer)
                            for s in evaluation.scores})

    def evaluation(self) -> Evaluation:
        return Evaluation(overall=self.overall, scores=tuple(
            MetricScore(metric=m, value=v.value, reason=v.reason, scorer=v.scorer) for m, v in self.metrics.items()))


class EvidenceContext(BaseModel):
    """A passage an answer was built from, as the scorers see it."""

    model_config = ConfigDict(frozen=True)

    text: str
    effective_date: datetime | None = Field(default=None, description="The document's date (effective or updated).")
    title: str | None = None


MAX_EVAL_CONTEXTS = 50
MAX_EVAL_TEXT_CHARS = 20_000
MAX_EVAL_TOTAL_CHARS = 200_000


class EvaluateRequest(BaseModel):
    """An answer produced elsewhere, to grade with the same scorers (``POST /v1/evaluate``)."""

    model_config = ConfigDict(extra="forbid")

    question: str = Field(min_length=1, max_length=4000)
    answer: str = Field(min_length=1, max_length=MAX_EVAL_TEXT_CHARS,
                        description="The answer; [n] markers cite the contexts by position (1-based).")
    contexts: list[str | EvidenceContext] = Field(
        max_length=MAX_EVAL_CONTEXTS,
        description='The passages the answer was built from: strings, or {"text", "effective_date"} objects.')
    reference: str | None = Field(default=None, max_length=MAX_EVAL_TEXT_CHARS,
                                  description="A reference answer, when there is one (correctness compares with it).")

    def evidence(self) -> list[EvidenceContext]:
        return [EvidenceContext(text=c) if isinstance(c, str) else c for c in self.contexts]

    @model_validator(mode="after")
    def _context_sizes(self) -> EvaluateRequest:
        for i, c in enumerate(self.evidence(), start=1):
            if len(c.text) > MAX_EVAL_TEXT_CHARS:
                raise ValueError(f"context {i} is longer than {MAX_EVAL_TEXT_CHARS} characters; send the passage "
                                 "the answer used, not the whole document")
        if sum(len(c.text) for c in self.evidence()) > MAX_EVAL_TOTAL_CHARS:
            raise ValueError(f"the contexts hold more than {MAX_EVAL_TOTAL_CHARS} characters together; send the "
                             "passages the answer used")
        return self
