"""Traceability: what share of the answer's sentences carry a verified citation?

A sentence is traced when it cites a context ([n]) and every context it cites supports it (the
same check the generator runs: most of its terms found in the cited chunk).
"""

from __future__ import annotations

from rag_service.domain import MetricScore
from rag_service.scoring.evidence import LOCAL_SCORER, ScoringInput


def score(inp: ScoringInput) -> MetricScore:
    claims = inp.checkable_claims
    if not claims:
        return MetricScore(metric="traceability", value=None, reason="the answer has no sentence to trace.",
                           scorer=LOCAL_SCORER)
    cited = sum(1 for c in claims if c.citations)
    verified = sum(1 for c in claims if c.verified)
    reason = f"{verified} of {len(claims)} sentences carry a verified citation"
    if cited > verified:
        reason += f" ({cited - verified} cite a context that does not support them)"
    return MetricScore(metric="traceability", value=round(verified / len(claims), 4), reason=reason + ".",
                       scorer=LOCAL_SCORER)
