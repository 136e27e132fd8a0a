"""IR measures shared by the retrieval benchmarks: a ranking as ranx wants it, the quality
metrics of a run (ranx), and latency percentiles."""

from __future__ import annotations

import uuid
from collections.abc import Iterable

import numpy as np

from evaluation.metrics import NO_RESULT as NO_RESULT  # re-exported: retrieval.py uses them from here
from evaluation.metrics import ranking as ranking
from rag_service.domain import SearchHit

METRICS = ("ndcg@10", "recall@100", "mrr@10")


def quality(qrels: dict[str, dict[str, int]], run: dict[str, dict[str, float]],
            metrics: Iterable[str] = METRICS) -> dict[str, float]:
    from ranx import Qrels, Run, evaluate

    scores = evaluate(Qrels({q: qrels[q] for q in run}), Run(run), list(metrics))
    if isinstance(scores, float):  # one metric comes back as a bare number
        scores = {next(iter(metrics)): scores}
    return {name: round(float(value), 4) for name, value in scores.items()}


def recall_at_k(found: Iterable[Iterable[SearchHit]], truth: Iterable[set[uuid.UUID]]) -> float:
    """Mean share of each query's true top k (chunk ids, e.g. from an exact scan) that the search found."""
    return round(float(np.mean([len({h.chunk_id for h in got} & want) / max(1, len(want))
                                for got, want in zip(found, truth, strict=True)])), 4)


def latency(ms: list[float]) -> dict[str, float | None]:
    if not ms:
        return {"p50_ms": None, "p95_ms": None, "mean_ms": None}
    values = np.asarray(ms)
    return {"p50_ms": round(float(np.percentile(values, 50)), 2), "p95_ms": round(float(np.percentile(values, 95)), 2),
            "mean_ms": round(float(values.mean()), 2)}


# --- the service, in process -----------------------------------------------------------------------------
