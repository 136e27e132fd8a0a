"""Faithfulness: is each claim of the answer supported by the retrieved contexts?

A claim quoted word for word is checked against the context it stands in (so it scores 1.0 unless
its own words fail the checks). Otherwise it is compared with its best-aligned context sentence and
that sentence's neighbours: the share of its content terms found there, lowered for
each fact (number, date, name) the evidence contradicts or does not state, and for a negation the
evidence does not share. The value is the mean over the claims that have content to check.
"""

from __future__ import annotations

from rag_service.domain import MetricScore
from rag_service.scoring.evidence import LOCAL_SCORER, ScoringInput, bare, evidence_for, quoted

# One contradicted fact halves a claim's support; an unstated one costs a quarter; so does a
# negation the evidence does not share (it turns the claim around).
CONTRADICTED = 0.5
UNSTATED = 0.75
NEGATION = 0.5


def claim_support(inp: ScoringInput, claim: str) -> tuple[float, str]:
    """(support in [0, 1], why) for one claim."""
    evidence = evidence_for(inp, claim)
    check = evidence.check
    value = evidence.overlap * CONTRADICTED ** len(check.contradicted) * UNSTATED ** len(check.unverifiable)
    if check.negation_mismatch:
        value *= NEGATION
    if not evidence.found:
        return value, "no context shares its words"
    problems = [f"{', '.join(check.contradicted)} contradicted" if check.contradicted else "",
                f"{', '.join(check.unverifiable)} not stated" if check.unverifiable else "",
                "negation differs" if check.negation_mismatch else ""]
    default = "quoted from a context" if evidence.quoted else f"{evidence.overlap:.0%} of its terms in the source"
    return value, "; ".join(p for p in problems if p) or default


def score(inp: ScoringInput) -> MetricScore:
    claims = [bare(c) for c in inp.checkable_claims]
    if not claims or not inp.contexts:
        reason = "the answer makes no checkable claim" if inp.contexts else "there are no contexts to check against"
        return MetricScore(metric="faithfulness", value=None, reason=reason, scorer=LOCAL_SCORER)
    judged = [(claim, *claim_support(inp, claim)) for claim in claims]
    value = sum(v for _, v, _ in judged) / len(judged)
    supported = sum(1 for _, v, _ in judged if v >= 0.6)
    weakest, low, why = min(judged, key=lambda j: j[1])
    reason = f"{supported} of {len(judged)} claims supported by the contexts"
    if low < 0.6:
        reason += f"; weakest ({low:.2f}, {why}): \"{quoted(weakest)}\""
    return MetricScore(metric="faithfulness", value=round(value, 4), reason=reason + ".", scorer=LOCAL_SCORER)
