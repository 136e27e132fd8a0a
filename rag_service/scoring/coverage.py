"""Coverage: are all aspects and sub-questions of the question answered?

Each question part is judged by the answer sentence that covers it best: the share of the part's
content terms the sentence takes up, averaged with whether it holds the kind of fact the part asks
for. A part at COVERED or above counts as answered. The value is the mean over parts, so an answer
to one of two sub-questions gets about half.
"""

from __future__ import annotations

from rag_service.domain import MetricScore
from rag_service.scoring.evidence import LOCAL_SCORER, ScoringInput, bare, content_terms
from rag_service.text.questions import expected_kind, has_new_fact

COVERED = 0.75  # a part whose best sentence covers this much of it counts as answered


def _covers(part: str, sentence: str) -> float:
    asked = content_terms(part)
    signals = [len(asked & content_terms(sentence)) / len(asked)] if asked else []
    kind = expected_kind(part)
    if kind is not None:
        signals.append(1.0 if has_new_fact(kind, sentence, part) else 0.0)
    return sum(signals) / len(signals) if signals else 0.0


def score(inp: ScoringInput) -> MetricScore:
    sentences = [bare(c) for c in inp.checkable_claims]
    if not sentences:
        return MetricScore(metric="coverage", value=None, reason="the answer has no content to judge.",
                           scorer=LOCAL_SCORER)
    parts = [p for p in inp.parts if content_terms(p) or expected_kind(p)]
    if not parts:
        return MetricScore(metric="coverage", value=None, scorer=LOCAL_SCORER,
                           reason="the question has no content words to check coverage against.")
    best = [max(_covers(part, s) for s in sentences) for part in parts]
    per_part = [min(1.0, b / COVERED) for b in best]
    value = sum(per_part) / len(per_part)
    missing = [p for p, v in zip(parts, per_part, strict=True) if v < 1.0]
    if len(parts) == 1:
        reason = "the question is answered" if not missing else "the answer only partly takes up the question"
    else:
        reason = f"{len(parts) - len(missing)} of {len(parts)} question parts answered"
        if missing:
            reason += f"; missing: \"{missing[0][:60]}\""
    return MetricScore(metric="coverage", value=round(value, 4), reason=reason + ".", scorer=LOCAL_SCORER)
