"""The types that pass between stages: ingestion and the stores, the pipeline's steps, the API
and (next) the evaluator. Everything above imports them from here; this package imports nothing
of the service but its own modules."""

from rag_service.domain.answers import Citation, Claim, GeneratedAnswer
from rag_service.domain.auth import GRANTS, ROLES, ApiKeyView, Caller, Role
from rag_service.domain.documents import (
    COLLECTION_PATTERN,
    ChunkRecord,
    CollectionSummary,
    DocumentRecord,
    DocumentState,
    DocumentSummary,
    JsonScalar,
    MetadataRange,
    SearchFilter,
    SearchHit,
    StoreCounts,
    StoredChunk,
)
from rag_service.domain.eval_runs import (
    IR_METRICS,
    LATENCY_METRIC,
    LOWER_IS_BETTER,
    RAGAS_OFFLINE_METRICS,
    REFERENCE_CORRECTNESS,
    SEVEN_METRICS,
    SQUAD_METRICS,
    DatasetRef,
    EvalItemResult,
    EvalMode,
    EvalRun,
    EvalRunRequest,
    EvalStatus,
    RetrievedRef,
    ScoreRow,
)
from rag_service.domain.evaluation import (
    METRICS,
    EvaluateRequest,
    Evaluation,
    EvaluationReport,
    EvidenceContext,
    MetricName,
    MetricScore,
    MetricValue,
)
from rag_service.domain.intent import Complexity, Entities, Intent, QueryType, TimeRangeModel, Turn
from rag_service.domain.jobs import JobStatus, JobView, Upload
from rag_service.domain.query import (
    MAX_QUESTION_CHARS,
    AnswerLogEntry,
    Clarification,
    QueryLogEntry,
    QueryRequest,
    QueryResult,
    RetrievalSummary,
    SearchFilters,
    StepRecord,
    StepStatus,
)
from rag_service.domain.reading import SpanReading
from rag_service.domain.retrieval import (
    MAX_QUERY_CHARS,
    MAX_TOP_K,
    Candidate,
    Iteration,
    RerankReport,
    RetrievalRequest,
    RetrievalResult,
    StrategyReport,
)
from rag_service.domain.review import (
    REVIEW_STATUSES,
    DecisionKind,
    GateMode,
    GateVerdict,
    ReviewCategory,
    ReviewStatus,
    ReviewTier,
    ReviewTrigger,
    ReviewTriggerSource,
)
from rag_service.domain.routing import (
    Condition,
    Guideline,
    GuidelineSet,
    ResolvedRoute,
    RouteDecision,
    RouteSpec,
)
from rag_service.domain.search import SearchRequest, SearchResponse, SearchResultPublic
from rag_service.domain.strategies import StrategyName, check_strategy_names, strategy_names
from rag_service.domain.syntax import Entity, Parsed, ParseDepth, Word
from rag_service.domain.tenants import (
    DEFAULT_TENANT,
    TENANT_PATTERN,
    CollectionKey,
    TenantScope,
    collection_key,
    collection_name,
    no_such_collection,
    tenant_of,
)
from rag_service.domain.traces import QueryTrace, TraceCandidate

__all__ = [
    "SpanReading",
    "Entity",
    "ParseDepth",
    "Parsed",
    "Word",
    "DEFAULT_TENANT",
    "TENANT_PATTERN",
    "CollectionKey",
    "TenantScope",
    "collection_key",
    "collection_name",
    "no_such_collection",
    "tenant_of",
    "QueryTrace", "TraceCandidate",
    "IR_METRICS", "LATENCY_METRIC", "LOWER_IS_BETTER", "RAGAS_OFFLINE_METRICS", "REFERENCE_CORRECTNESS",
    "SEVEN_METRICS", "SQUAD_METRICS",
    "DatasetRef", "EvalItemResult", "EvalMode", "EvalRun", "EvalRunRequest", "EvalStatus", "RetrievedRef", "ScoreRow",
    "GRANTS", "REVIEW_STATUSES", "ROLES", "ApiKeyView", "Caller", "DecisionKind", "EvaluateRequest", "EvaluationReport",
    "EvidenceContext",
    "GateMode", "GateVerdict", "MetricValue", "ReviewCategory", "ReviewStatus", "ReviewTier", "ReviewTrigger",
    "ReviewTriggerSource", "Role",
    "COLLECTION_PATTERN", "MAX_QUERY_CHARS", "MAX_QUESTION_CHARS", "MAX_TOP_K", "METRICS", "AnswerLogEntry",
    "Candidate", "ChunkRecord", "Citation", "Claim", "Clarification", "CollectionSummary", "Complexity", "Condition",
    "DocumentRecord",
    "DocumentState", "DocumentSummary", "Entities", "Evaluation", "GeneratedAnswer", "Guideline", "GuidelineSet",
    "Intent", "Iteration", "JobStatus", "JobView", "JsonScalar", "MetadataRange", "MetricName", "MetricScore",
    "QueryLogEntry", "QueryRequest", "QueryResult", "QueryType", "RerankReport", "ResolvedRoute", "RetrievalRequest",
    "RetrievalResult", "RetrievalSummary", "RouteDecision", "RouteSpec", "SearchFilter", "SearchFilters",
    "SearchHit", "SearchRequest", "SearchResponse", "SearchResultPublic", "StepRecord", "StepStatus", "StoreCounts",
    "StoredChunk", "StrategyName", "StrategyReport", "TimeRangeModel", "Turn", "Upload", "check_strategy_names",
    "strategy_names",
]
