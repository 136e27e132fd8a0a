"""Relevance: does the answer address the question, and each of its sub-questions?

Per question part, three signals: how many of the part's content terms the answer takes up, whether
the answer holds the kind of fact the question asks for (a number for "how many", a date for
"when", a name for "who"/"where") beyond those the question itself states, and, when the caller
computed it, the embedder's cosine between question and answer. The value is the mean over parts.
"""

from __future__ import annotations

from rag_service.domain import MetricScore
from rag_service.scoring.evidence import LOCAL_SCORER, ScoringInput, content_terms
from rag_service.text.citations import strip_markers
from rag_service.text.questions import expected_kind, has_new_fact

# A good answer restates about half of a question's content terms; taking up more adds little.
TERMS_SATURATE = 0.5
WEIGHTS = {"terms": 0.5, "kind": 0.25, "similarity": 0.25}


def part_relevance(inp: ScoringInput, part: str, answer: str | None = None) -> tuple[float | None, dict[str, float]]:
    """(value, the signals) for one question part against the answer (or a piece of it)."""
    answer = strip_markers(inp.answer if answer is None else answer)
    asked = content_terms(part)
    said = content_terms(answer)
    signals: dict[str, float] = {}
    if asked:
        signals["terms"] = min(1.0, len(asked & said) / len(asked) / TERMS_SATURATE)
    kind = expected_kind(part)
    if kind is not None:
        signals["kind"] = 1.0 if has_new_fact(kind, answer, part) else 0.0
    if inp.similarity is not None:
        signals["similarity"] = max(0.0, min(1.0, inp.similarity))
    if not signals or ("terms" not in signals and "kind" not in signals):
        return None, signals  # "Why?": nothing in the part to compare the answer with
    total = sum(WEIGHTS[k] for k in signals)
    return sum(WEIGHTS[k] * v for k, v in signals.items()) / total, signals


def score(inp: ScoringInput) -> MetricScore:
    if not content_terms(strip_markers(inp.answer)):
        return MetricScore(metric="relevance", value=None, reason="the answer has no content to judge.",
                           scorer=LOCAL_SCORER)
    judged = [(part, v, s) for part in inp.parts for v, s in [part_relevance(inp, part)] if v is not None]
    if not judged:
        return MetricScore(metric="relevance", value=None, scorer=LOCAL_SCORER,
                           reason="the question has no content words to compare the answer with.")
    value = sum(v for _, v, _ in judged) / len(judged)
    weakest, low, signals = min(judged, key=lambda j: j[1])
    shown = ", ".join(f"{k} {v:.2f}" for k, v in signals.items())
    if len(judged) == 1:
        how = "addresses" if value >= 0.6 else "barely addresses" if value >= 0.3 else "does not address"
        reason = f"the answer {how} the question ({shown})"
    else:
        reason = f"mean over {len(judged)} question parts; weakest \"{weakest[:60]}\" ({shown})"
    return MetricScore(metric="relevance", value=round(value, 4), reason=reason + ".", scorer=LOCAL_SCORER)
