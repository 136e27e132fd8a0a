"""An answer's grades: seven metrics, each a value in [0, 1] or None ("could not judge"), with the
reason and the scorer that produced it, and a weighted overall score."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
        overall = sum(v * w for v, w in judged) / total if total > 0 else None
        return cls(scores=tuple(scores), overall=None if overall is None else round(overall, 4))

    def get(self, metric: MetricName) -> MetricScore | None:
        return next((s for s in self.scores if s.metric == metric), None)
