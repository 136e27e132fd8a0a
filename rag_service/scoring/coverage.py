"""Coverage: are all aspects and sub-questions of the question answered?

Each question part counts as covered by the answer sentence that addresses it best (relevance of
that sentence to the part); a part no sentence addresses is uncovered. The value is the mean over
parts, so an answer to one of two sub-questions gets about half.
"""

from __future__ import annotations

from rag_service.domain import MetricScore
from rag_service.scoring.evidence import LOCAL_SCORER, ScoringInput, bare
from rag_service.scoring.relevance import part_relevance

COVERED = 0.5  # a part whose best sentence scores this much relevance counts as answered


def score(inp: ScoringInput) -> MetricScore:
    sentences = [bare(c) for c in inp.checkable_claims]
    if not sentences:
        return MetricScore(metric="coverage", value=None, reason="the answer has no content to judge.",
                           scorer=LOCAL_SCORER)
    best = [max(part_relevance(inp, part, s)[0] for s in sentences) for part in inp.parts]
    # Relevance of the best sentence, scaled so that COVERED and above count as fully answered.
    per_part = [min(1.0, b / COVERED) for b in best]
    value = sum(per_part) / len(per_part)
    missing = [p for p, v in zip(inp.parts, per_part, strict=True) if v < 1.0]
    if len(inp.parts) == 1:
        reason = "the question is answered" if not missing else "the answer only partly takes up the question"
    else:
        reason = f"{len(inp.parts) - len(missing)} of {len(inp.parts)} question parts answered"
        if missing:
            reason += f"; missing: \"{missing[0][:60]}\""
    return MetricScore(metric="coverage", value=round(value, 4), reason=reason + ".", scorer=LOCAL_SCORER)
