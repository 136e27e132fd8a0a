"""Correctness: do the answer's facts agree with the evidence, or with a reference answer?

With a reference, the value is how much of the reference the answer states (its content terms,
facts counted twice) and whether the answer contradicts the reference's facts. Without one,
each claim's numbers, dates, names and negation are checked against its best-aligned evidence:
agreed, contradicted (another value in the same place) or not stated. A claim with none of these
is judged by its wording alone (the share of its terms the evidence holds).
"""

from __future__ import annotations

from rag_service.domain import MetricScore
from rag_service.scoring.evidence import LOCAL_SCORER, ScoringInput, bare, content_terms, evidence_for, quoted
from rag_service.text.citations import strip_markers
from rag_service.text.facts import compare, facts

# An unstated fact counts half against a claim: it may be true, but nothing here says so.
UNSTATED_WEIGHT = 0.5


def against_reference(answer: str, reference: str) -> MetricScore:
    """Correctness of an answer (citation markers allowed) against one reference answer."""
    answer = strip_markers(answer)
    ref_terms = content_terms(reference)
    ref_facts = {v for _, v in facts(reference).all()}
    if not ref_terms:
        return MetricScore(metric="correctness", value=None, reason="the reference answer has no content to compare.",
                           scorer=LOCAL_SCORER)
    answer_terms = content_terms(answer)
    weight = {t: 2.0 if t in ref_facts else 1.0 for t in ref_terms}
    recall = sum(w for t, w in weight.items() if t in answer_terms) / sum(weight.values())
    check = compare(answer, reference)
    value = recall * (0.5 ** len(check.contradicted)) * (0.5 if check.negation_mismatch and recall > 0 else 1.0)
    reason = f"the answer states {recall:.0%} of the reference answer"
    if check.contradicted:
        reason += f"; {', '.join(check.contradicted)} contradict it"
    if check.negation_mismatch:
        reason += "; negation differs"
    return MetricScore(metric="correctness", value=round(value, 4), reason=reason + ".", scorer=LOCAL_SCORER)


def claim_correctness(inp: ScoringInput, claim: str) -> tuple[float, str]:
    evidence = evidence_for(inp, claim)
    check = evidence.check
    if not evidence.found or check.checked == 0:
        why = "no facts; judged by wording" if evidence.found else "no evidence found"
        return evidence.overlap, why
    right = len(check.agreed)
    wrong = len(check.contradicted) + int(check.negation_mismatch)
    unsure = UNSTATED_WEIGHT * len(check.unverifiable)
    # Checkable facts decide; the wording still counts for a claim whose facts are borrowed
    # from an unrelated passage.
    value = right / (right + wrong + unsure) if right + wrong + unsure else 0.0
    value *= min(1.0, 0.5 + evidence.overlap)
    problems = ([f"{', '.join(check.contradicted)} contradicted"] if check.contradicted else []) + \
               (["negation differs"] if check.negation_mismatch else []) + \
               ([f"{', '.join(check.unverifiable)} not stated"] if check.unverifiable else [])
    return value, "; ".join(problems) or "facts agree"


def score(inp: ScoringInput) -> MetricScore:
    if inp.reference:
        return against_reference(inp.answer, inp.reference)
    claims = [bare(c) for c in inp.checkable_claims]
    if not claims or not inp.contexts:
        reason = "the answer makes no checkable claim" if inp.contexts else "there is no evidence to check against"
        return MetricScore(metric="correctness", value=None, reason=reason + ".", scorer=LOCAL_SCORER)
    judged = [(claim, *claim_correctness(inp, claim)) for claim in claims]
    value = sum(v for _, v, _ in judged) / len(judged)
    worst, low, why = min(judged, key=lambda j: j[1])
    reason = (f"the facts of all {len(judged)} claim(s) agree with the evidence" if low >= 0.8
              else f"\"{quoted(worst)}\": {why}")
    return MetricScore(metric="correctness", value=round(value, 4), reason=reason + ".", scorer=LOCAL_SCORER)
