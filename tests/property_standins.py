"""Stand-ins for the query pipeline's collaborators (the Protocols in pipeline/collaborators.py), and the
hypothesis settings, shared by the design's property tests (tests/test_design_properties*.py)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from rag_service.domain import (
    METRICS,
    Candidate,
    GuidelineSet,
    MetricScore,
    QueryLogEntry,
    RetrievalRequest,
    RetrievalResult,
    SearchHit,
    Turn,
)

NOW = datetime(2026, 6, 15, tzinfo=UTC)
PURE = settings(max_examples=200, deadline=None)
PIPELINE = settings(max_examples=100, deadline=None)
# One database for every example: the module's (function-scoped autouse fixtures only isolate
# settings, which every example may share).
STORED = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

PASSAGES = {
    "dough": "Knead the dough for ten minutes, then let it rise for about an hour.",
    "ivfflat": "IVFFlat partitions vectors into lists around k-means centroids.",
    "incident": "In March 2026 the connection pool was exhausted and clients saw error E-4012.",
    "refund": "The refund window is 30 days from delivery. Customers in Norway are not eligible for cash refunds.",
}


def passage(key: str, rank: int) -> Candidate:
    body = PASSAGES[key]
    hit = SearchHit(chunk_id=uuid.uuid5(uuid.NAMESPACE_URL, key), document_id=uuid.uuid5(uuid.NAMESPACE_DNS, key),
                    parent_id=None, ordinal=0, source_uri=f"{key}.md", title=key.title(), text=body, start_char=0,
                    end_char=len(body), score=1.0 / rank, document_date=datetime(2026, 3, 1, tzinfo=UTC))
    return Candidate(hit=hit, fused_score=1.0 / rank, ranks={"semantic": rank}, scores={"semantic": 0.7 - 0.05 * rank})


# --- fakes of the orchestrator's collaborators (the Protocols in pipeline/collaborators.py) -----------------

class PassageRetriever:
    """Every passage, those whose key the query mentions first; records each request."""

    def __init__(self) -> None:
        self.requests: list[RetrievalRequest] = []

    async def retrieve(self, request: RetrievalRequest) -> RetrievalResult:
        self.requests.append(request)
        words = request.query.lower()
        keys = sorted(PASSAGES, key=lambda k: k[:5] not in words)
        return RetrievalResult(candidates=[passage(k, i) for i, k in enumerate(keys, start=1)], iterations=[],
                               confidence=0.8, elapsed_ms=1.0)


class MemoryLog:
    def __init__(self) -> None:
        self.entries: list[QueryLogEntry] = []

    async def turns(self, conversation_id: str, collection: str, principals: Sequence[str],
                    limit: int = 5) -> list[Turn]:
        return []

    async def record(self, entry: QueryLogEntry) -> None:
        self.entries.append(entry)

    async def record_grades(self, query_id: uuid.UUID, **grades: object) -> None:
        return None


@dataclass
class FixedGuidelines:
    guidelines: GuidelineSet

    async def current(self) -> tuple[int, GuidelineSet]:
        return 1, self.guidelines


class AnyCollection:
    async def collection_exists(self, name: str) -> bool:
        return True


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    async def __call__(self, kind: str, data: dict[str, Any]) -> None:
        self.seen.append((kind, data))

    def one(self, kind: str) -> dict[str, Any]:
        [data] = [d for k, d in self.seen if k == kind]
        return data


@dataclass
class ScriptedIntentLLM:
    """The LLM the intent parser asks when the rules are unsure: replies with ``reply``."""

    reply: str

    def model_for(self, tier: str) -> str:
        return "fake"

    async def complete(self, messages: Sequence[Any], **_: Any) -> str:
        return self.reply

    async def stream(self, messages: Sequence[Any], **_: Any) -> Any:
        yield self.reply


def scored(values: Sequence[float | None], scorer: str) -> list[MetricScore]:
    return [MetricScore(metric=m, value=v, reason=f"{m} given", scorer=scorer)
            for m, v in zip(METRICS, values, strict=True) if v is not None or scorer == "local"]


# Question clauses that cue the query types, and grades of any quality, for the strategies.
CLAUSES = ("how long should the dough rise", "what is IVFFlat", "why did error E-4012 appear",
           "compare HNSW versus IVFFlat", "summarize the incident report", "what changed since March 2026",
           'where is "pool exhausted" logged', "how does the connection pool recover",
           "who approved the pricing policy in 2024", "list the steps to reset a password",
           "what does ef_search trade off", "when was version 2 released", "what is it",
           "how do refunds work for customers in Norway", "give me an overview of the refund policy")
METRIC_VALUES = st.lists(st.none() | st.floats(0, 1), min_size=7, max_size=7)
