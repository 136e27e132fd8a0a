"""Weighted reciprocal-rank fusion (Cormack et al., 2009), as a pure function.

Each ranked list votes ``weight / (k + rank)`` for every chunk it holds; a chunk found by
several strategies (or several query variants) adds the votes up, which is what makes RRF
robust to scores on incomparable scales (cosine similarity vs BM25).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rag_service.domain import Candidate, SearchHit


@dataclass(frozen=True)
class RankedList:
    """One strategy's hits for one query variant, best first."""

    strategy: str
    hits: Sequence[SearchHit]
    weight_factor: float = 1.0  # e.g. query variants vote less than the original query


def reciprocal_rank_fusion(
    lists: Sequence[RankedList], weights: Mapping[str, float], k: float = 60.0
) -> list[Candidate]:
    """Fuse ranked lists into candidates, best first. Ties break on the best single rank, then
    on chunk id, so the order is deterministic. A strategy without a weight gets weight 1."""
    if k < 0:
        raise ValueError("RRF k must be >= 0")
    fused: dict[object, float] = {}
    hits: dict[object, SearchHit] = {}
    ranks: dict[object, dict[str, int]] = {}
    scores: dict[object, dict[str, float]] = {}
    for ranked in lists:
        weight = weights.get(ranked.strategy, 1.0) * ranked.weight_factor
        seen: set[object] = set()
        for rank, hit in enumerate(ranked.hits, start=1):
            key = hit.chunk_id
            if key in seen:  # a list naming a chunk twice votes once, at its best rank
                continue
            seen.add(key)
            hits.setdefault(key, hit)
            fused[key] = fused.get(key, 0.0) + weight / (k + rank)
            chunk_ranks = ranks.setdefault(key, {})
            if rank < chunk_ranks.get(ranked.strategy, rank + 1):
                chunk_ranks[ranked.strategy] = rank
                scores.setdefault(key, {})[ranked.strategy] = hit.score
    order = sorted(fused, key=lambda c: (-fused[c], min(ranks[c].values()), str(c)))
    return [
        Candidate(hit=hits[c], fused_score=fused[c], ranks=ranks[c], scores=scores.get(c, {}))
        for c in order
    ]
