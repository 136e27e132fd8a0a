"""Consistency: are the answer's sentences, and the sources it relies on, free of contradictions?

Two statements about the same thing (sharing most of their terms) contradict each other when
they state different numbers or dates in the same place, or one negates what the other affirms.
Checked between every two answer sentences, and between the passages of different sources that
back the same claim. The value is the share of such comparisons without a contradiction.
"""

from __future__ import annotations

from itertools import combinations

from rag_service.domain import MetricScore
from rag_service.scoring.evidence import LOCAL_SCORER, Passage, ScoringInput, bare
from rag_service.text.facts import compare, facts, topic_terms

# Pairwise checks grow with the square of the statements: past this many claims only the first
# ones are compared (an answer that long is rare; /v1/evaluate accepts long ones).
MAX_CLAIMS = 40

SAME_TOPIC = 0.5  # Jaccard similarity of topic terms above which two statements speak of the same thing


def _same_topic(a: frozenset[str], b: frozenset[str]) -> bool:
    return bool(a and b) and len(a & b) / len(a | b) >= SAME_TOPIC


def _conflict(a: str, b: str) -> str | None:
    check = compare(a, b)
    stated = facts(a)
    numeric = [v for v in check.contradicted if v in stated.numbers or v in stated.dates]  # not names
    if numeric:
        return f"{', '.join(numeric)} against another value"
    if check.negation_mismatch:
        return "one negates the other"
    return None


def score(inp: ScoringInput) -> MetricScore:
    claims = [bare(c) for c in inp.checkable_claims][:MAX_CLAIMS]
    if not claims:
        return MetricScore(metric="consistency", value=None, reason="the answer has no content to judge.",
                           scorer=LOCAL_SCORER)
    compared = 0
    conflicts: list[str] = []
    for a, b in combinations(claims, 2):
        if _same_topic(topic_terms(a), topic_terms(b)):
            compared += 1
            if (why := _conflict(a, b)) is not None:
                conflicts.append(f"answer sentences disagree ({why})")
    sources = inp.cited or list(range(len(inp.contexts)))
    for claim in claims:
        backing: list[Passage] = []
        for i in sources:
            aligned = inp.align(claim, [i])
            if aligned.sentence is not None and aligned.overlap >= SAME_TOPIC:
                backing.append(aligned.sentence)
        for a, b in combinations(backing, 2):
            if a.context != b.context and _same_topic(topic_terms(a.text), topic_terms(b.text)):
                compared += 1
                if (why := _conflict(a.text, b.text)) is not None:
                    conflicts.append(f"sources [{a.context + 1}] and [{b.context + 1}] disagree ({why})")
    if not compared:
        # Nothing to compare is no evidence of consistency: leave the metric out of the overall.
        return MetricScore(metric="consistency", value=None, scorer=LOCAL_SCORER,
                           reason="no two statements (in the answer or its sources) speak of the same thing.")
    value = 1 - len(conflicts) / compared
    reason = conflicts[0] if conflicts else f"{compared} related statements checked, none contradict"
    return MetricScore(metric="consistency", value=round(value, 4), reason=reason + ".", scorer=LOCAL_SCORER)
