"""Offline evaluation runs as they are stored, compared, reported and shown by the API.

A run is one dataset (by content hash and split) put through the service under one configuration
(snapshotted, hashed); it holds one :class:`EvalItemResult` per item and repetition. Retrieval
metrics, answer metrics and the seven grades of an item sit in one ``metrics`` mapping, so they
join per item by construction.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, Field

from rag_service.domain.documents import COLLECTION_PATTERN
from rag_service.domain.tenants import CollectionKey

EvalMode = Literal["retrieval", "full"]
EvalStatus = Literal["queued", "running", "finished", "failed"]
DatasetKind = Literal["beir", "qa", "golden"]

# Metric names as stored in EvalItemResult.metrics (every value in [0, 1] unless named *_ms).
IR_METRICS = ("ndcg@10", "recall@10", "recall@100", "mrr@10")
SEVEN_METRICS = ("faithfulness", "relevance", "correctness", "coverage", "consistency", "freshness",
                 "traceability", "overall")
# The local scorer's correctness against the item's best reference answer: the live grade (the seven)
# has no reference, so an extractive quote is "correct" against its own evidence by construction.
REFERENCE_CORRECTNESS = "correctness_vs_reference"
SQUAD_METRICS = ("squad_exact_match", "squad_f1")  # SQuAD v1.1 normalisation, best over the references
RAGAS_OFFLINE_METRICS = ("ragas_exact_match", "ragas_rouge_l", "ragas_bleu", "ragas_semantic_similarity",
                         "ragas_context_precision", "ragas_context_recall")
LATENCY_METRIC = "latency_ms"
LOWER_IS_BETTER = frozenset({LATENCY_METRIC, "cost_usd"})


class DatasetRef(BaseModel):
    kind: DatasetKind
    name: str
    version: str = Field(description="Content hash of the files (or golden rows) the items came from.")
    split: str | None = None
    source: str | None = Field(default=None, description="Where it was read from (a path, or 'golden').")
    items: int = Field(description="Items in the dataset (before --limit).")


class EvalRunRequest(BaseModel):
    """What to run: the CLI's flags and ``POST /v1/eval-runs``'s body."""

    model_config = {"extra": "forbid"}

    dataset: str = Field(min_length=1, max_length=4096,
                         description="beir:DIR (BEIR directory), qa:FILE (question/answer JSONL) or golden.")
    split: str = Field(default="test", pattern=r"^[\w.-]{1,64}$", description="BEIR qrels split.")
    mode: EvalMode = Field(default="retrieval", description="retrieval: IR metrics only; full: answers, the seven "
                                                            "grades and the answer metrics too.")
    collection: str | None = Field(default=None, pattern=COLLECTION_PATTERN, description=(
        "Run against this collection (its corpus is ingested into it when the dataset has one). Default: a "
        "collection named after the dataset and its version, ingested once and reused."))
    limit: int | None = Field(default=None, ge=1, le=1_000_000, description="Only the first N items.")
    concurrency: int = Field(default=4, ge=1, le=64)
    repeat: int = Field(default=1, ge=1, le=20, description="Times each item is run (answers may vary).")
    name: str | None = Field(default=None, min_length=1, max_length=200)
    seed: int = Field(default=0, ge=0, le=2**31 - 1)
    prompts: dict[str, int] = Field(default_factory=dict, description=(
        "Prompt versions to answer with instead of production, e.g. {\"answer_extractive\": 3}; the key "
        "'guidelines' pins the router's guideline version."))


class EvalRun(BaseModel):
    id: uuid.UUID
    name: str | None
    status: EvalStatus
    dataset: DatasetRef
    mode: EvalMode
    collection: CollectionKey
    request: EvalRunRequest
    config: dict[str, Any] = Field(description="The configuration snapshot the run used.")
    config_hash: str
    code_version: str | None = Field(description="The git commit, when the code runs from a checkout.")
    seed: int
    items_total: int = Field(description="Items x repetitions to run.")
    items_done: int = 0
    items_failed: int = 0
    summary: dict[str, Any] = Field(default_factory=dict, description="Per metric mean and count, when finished.")
    error: str | None = None
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None


class RetrievedRef(BaseModel):
    rank: int = Field(ge=1)
    id: str = Field(description="The document's source id (BEIR _id, or the source URI).")
    score: float | None = None


class EvalItemResult(BaseModel):
    item_id: str
    repetition: int = Field(ge=0)
    question: str
    references: list[str] = Field(default_factory=list, description="Reference answers (QA items).")
    retrieved: list[RetrievedRef] = Field(default_factory=list)
    relevant_rank: int | None = Field(default=None, description="Rank of the first relevant document, if any.")
    answer: str | None = None
    short_answer: str | None = None
    outcome: str | None = None
    metrics: dict[str, float | None] = Field(default_factory=dict)
    scorers: dict[str, str] = Field(default_factory=dict, description="Which scorer produced each metric.")
    latency_ms: dict[str, float] = Field(default_factory=dict, description="Per pipeline step, and 'total'.")
    tokens: dict[str, int] | None = None
    cost_usd: float | None = None
    error: str | None = None


class ScoreRow(NamedTuple):
    """An item result as a comparison reads it (``EvalRunRepository.scores``): its numbers only."""

    item_id: str
    metrics: dict[str, float | None]
    latency_total_ms: float | None
    cost_usd: float | None
    failed: bool
