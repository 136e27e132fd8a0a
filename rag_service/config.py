"""The one Settings object. Nothing else in the service reads the environment.

Every knob is an environment variable with the prefix ``RAGSVC_`` (or a line in ``.env``).
A bad value fails at start-up with a :class:`~rag_service.errors.ConfigError` that names the
variable, instead of surfacing later as a confusing stack trace.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, TypeAdapter, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from rag_service.domain.evaluation import METRICS
from rag_service.domain.strategies import check_strategy_names, strategy_names
from rag_service.errors import ConfigError
from rag_service.redaction import hide_password

ENV_PREFIX = "RAGSVC_"

# Only plain identifiers: the value is interpolated into DDL (a regconfig name), never user input.
_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]*$")
_BOOL = TypeAdapter(bool)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
        validate_default=True,
    )

    environment: Literal["development", "production"] = Field(
        default="development",
        description="production refuses development-only defaults (the embedded database) at start-up.",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "INFO"
    trace_retention_days: float = Field(default=30, gt=0, description="Stored query traces older than this are "
                                        "deleted (hourly by `ragsvc serve`, or `ragsvc traces cleanup`).")
    log_format: Literal["auto", "json", "text"] = Field(
        default="auto", description="auto: JSON lines from `ragsvc serve` and `ragsvc worker`, text elsewhere.")

    # --- storage -------------------------------------------------------------------------
    database_url: str | None = Field(
        default=None,
        description="PostgreSQL with pgvector. Unset: an embedded PostgreSQL under data_dir.",
    )
    data_dir: Path = Field(default=Path(".ragsvc"), description="Embedded database and local state.")
    embedded_start_wait_s: float = Field(
        default=60.0, gt=0, description="How long starting the embedded database waits for another process "
        "(one starting or stopping a server, a server still starting) before a clear error.")
    # A query runs its strategies on separate connections; 16 pooled connections serve about 16
    # concurrent requests without opening (and forking a PostgreSQL backend for) new ones.
    db_pool_size: int = Field(default=16, ge=1, le=100)
    db_max_overflow: int = Field(default=16, ge=0, le=200)
    db_statement_timeout_ms: int = Field(default=30_000, ge=100)
    text_search_config: str = Field(default="english", description="PostgreSQL text search configuration.")
    hnsw_m: int = Field(default=16, ge=2, le=100)
    hnsw_ef_construction: int = Field(default=64, ge=4, le=1000)
    # From the measured curve at 1,000,000 chunks (docs/benchmarks.md, "Scale"): recall@10 against an
    # exact scan 0.93 at 40, 0.966 at 100, 0.988 at 200; p95 7.2 ms at 100, 10.7 ms at 200.
    hnsw_ef_search: int = Field(default=100, ge=1, le=1000)
    vector_index: Literal["full", "half"] = Field(
        default="full", description="half: walk the half-precision HNSW index `ragsvc db half-index` builds "
                                    "(pgvector 0.7+; 57% of the full index's size, the same recall@10 at 1M chunks).")
    pattern_timeout_ms: int = Field(default=2_000, ge=10, description="Bound on one pattern search.")
    pattern_max_matches: int = Field(
        default=1_000, ge=1, description="The pattern strategy leaves a pattern found in more chunks than this to "
                                         "keyword search (ranking by occurrences would read every one).")
    keyword_engine: Literal["auto", "postgres", "tantivy"] = Field(
        default="auto", description="BM25 top k: scored in SQL over every posting (postgres), or from a tantivy index "
                                    "under data_dir kept in step with PostgreSQL and rescored exactly (tantivy); auto: "
                                    "tantivy for collections of keyword_index_min_chunks or more.")
    keyword_index_min_chunks: int = Field(
        default=20_000, ge=0, description="With keyword_engine auto: the collection size from which the tantivy index "
                                          "is built and used (smaller ones are scored in SQL, fast at that size).")

    # --- embeddings ------------------------------------------------------------------------
    embedding_provider: Literal["local", "openai"] = "local"
    embedding_model: str = "all-MiniLM-L6-v2"
    embedding_backend: Literal["onnx", "torch"] = Field(
        default="onnx", description="Local model runtime: onnx (faster) or torch (sentence-transformers)."
    )
    # pgvector's HNSW index takes vectors of at most 2,000 dimensions.
    embedding_dimension: int = Field(default=384, ge=1, le=2000)
    embedding_batch_size: int = Field(default=64, ge=1, le=4096)
    embedding_max_seq_length: int = Field(default=256, ge=8, le=8192)
    embedding_base_url: str | None = None
    embedding_api_key: SecretStr | None = None

    # --- ingestion ---------------------------------------------------------------------------
    chunk_size: int = Field(default=256, ge=32, le=8192, description="Tokens per chunk (model tokens).")
    chunk_overlap: int = Field(default=32, ge=0, le=4096)
    chunk_hierarchical: bool = Field(default=False, description="Store parent chunks, embed their children.")
    parent_chunk_size: int = Field(default=1024, ge=64, le=32_768)
    ingest_max_file_bytes: int = Field(default=50 * 1024 * 1024, ge=1)
    ingest_batch_documents: int = Field(default=64, ge=1, le=10_000)
    ingest_max_files: int = Field(default=1000, ge=1, description="Files or documents in one upload request.")
    ingest_max_request_bytes: int = Field(default=512 * 1024 * 1024, ge=1, description=(
        "The body of one upload request (its Content-Length)."))
    max_queued_jobs: int = Field(default=1000, ge=1, description=(
        "Ingestion jobs waiting to run, across all replicas; a new upload beyond it is a 503 with Retry-After."))

    # --- limits: per key, and per process -----------------------------------------------------
    rate_limit: str | None = Field(default="1200/minute", description=(
        "Requests per API key to /v1 and /mcp, in the `limits` library's notation ('1200/minute', "
        "'20/second;10000/hour'); empty: no limit. Counted per process; the keyless local admin is not limited."))
    max_inflight_queries: int = Field(default=64, ge=1, description=(
        "Queries and searches one process works on at once; one more is a 503 with Retry-After."))

    # --- retrieval ---------------------------------------------------------------------------
    retrieval_strategies: str = Field(
        default="semantic,keyword,pattern,metadata",
        description="Strategies a search runs when the request names none (comma-separated).",
    )
    retrieval_candidates: int = Field(default=100, ge=1, le=1000, description="Depth of each strategy's list.")
    rrf_k: float = Field(default=60.0, ge=0, description="Reciprocal-rank fusion constant.")
    fusion_weights: dict[str, float] = Field(
        default_factory=lambda: {"semantic": 1.0, "keyword": 1.0, "pattern": 1.0, "metadata": 0.5},
        description='Weight of each strategy in the fusion, as JSON: {"semantic": 1, "keyword": 1}.',
    )
    keyword_scoring: Literal["bm25", "ts_rank_cd"] = "bm25"
    bm25_k1: float = Field(default=1.2, ge=0, le=10)
    bm25_b: float = Field(default=0.75, ge=0, le=1)
    semantic_exact_below: int = Field(
        default=0, ge=0, description="Exact (not HNSW) vector search below this many chunks; 0 = always HNSW."
    )
    metadata_order: Literal["newest", "oldest", "relevance"] = "newest"
    reranker: Literal["auto", "local", "cohere", "none"] = Field(
        default="auto", description="auto: Cohere when RAGSVC_COHERE_API_KEY is set, else the local ranker."
    )
    rerank_top_n: int = Field(
        default=200, ge=1, le=2000, description="Fused candidates the reranker orders (the rest keep their order)."
    )
    rerank_timeout_s: float = Field(default=2.0, gt=0)
    cohere_api_key: SecretStr | None = None
    cohere_base_url: str | None = None
    cohere_rerank_model: str = "rerank-v3.5"
    adaptive_retrieval: bool = True
    adaptive_min_confidence: float = Field(default=0.5, ge=0, le=1)
    adaptive_max_iterations: int = Field(default=3, ge=1, le=10)
    adaptive_time_budget_ms: float = Field(default=400.0, gt=0)

    # --- query pipeline ----------------------------------------------------------------------
    clarify_ambiguity_threshold: float = Field(
        default=0.6, gt=0, le=1, description="At or above this ambiguity the pipeline asks back instead of answering."
    )
    query_retrieve_budget_s: float = Field(default=10.0, gt=0, description="Time budget of one retrieval step.")
    query_generate_budget_s: float = Field(default=60.0, gt=0, description="Time budget of the generation step.")
    conversation_turns: int = Field(default=5, ge=0, le=50, description="Earlier turns a follow-up may refer to.")
    query_retrieval_candidates: int = Field(
        default=40, ge=1, le=1000,
        description="Depth of each strategy's list when answering (search uses retrieval_candidates).",
    )
    answer_token_alignment: bool = Field(
        default=True,
        description="The second look: where the answerability model is less than 3 log-odds under the abstention "
                    "threshold or 0.25 over it (about 4% of XQuAD's answerable questions), a second pair of models "
                    "also reads how closely the best passage matches the question token by token (an int8 copy of "
                    "the local encoder, one call) and, with the span reader on, its better gap over the best "
                    "sentence and the runner-up (one more read); ignored with a remote embedder.",
    )
    answer_reader: bool = Field(
        default=True,
        description="The span reader (all-MiniLM-L6-v2 fine-tuned on SQuAD's train split, an int8 graph shipped "
                    "in the package) reads the best sentence: the answerability model reads how far its "
                    "best span stands above 'no answer', and its span is the short answer when it is sure enough. "
                    "Not a statement or a question in parts; keywords are read for its gap, its span being the short "
                    "answer to questions only. About 5 ms of CPU per "
                    "answer: on XQuAD short answers for 51% of questions at exact match 0.62 and abstention without "
                    "the paragraph 0.779, for /v1/query p95 5-9 ms above it off side by side. Off: the answerability "
                    "models read its feature as unknown (its training mean; they were trained for it on and then "
                    "answer 0.949), and short answers come from the pattern model (and the parse, if set).",
    )
    answer_short_answer_parse: Literal["off", "entities", "full"] = Field(
        default="off",
        description="Where the span reader's span is not the short answer to a question (answer_reader off, a "
                    "question in parts; keywords and statements get none): "
                    "what short answers read of the best sentence beyond its words (spaCy's small English "
                    "pipeline, the extra rag-service[parse]; figures measured before the reader): 'entities', its "
                    "named entities (over HTTP on "
                    "XQuAD 26% of questions get one at exact match 0.61 instead of 19% at 0.63, for about 5 ms "
                    "of CPU per answer: p95 5-13 ms above the default side by side on a slow 2-core VM); "
                    "'full', also the question's and the sentence's dependency parse (34% at 0.62, about 12 ms "
                    "of CPU: p95 15-28 ms above); 'off'. true / false mean full / off.",
    )
    answer_abstain_below: float = Field(
        default=0.105, ge=0, le=1,
        description="The extractive answer says the documents do not answer (outcome no_answer) when the "
                    "answerability model's probability that its best passage holds the answer is below this; "
                    "0 never abstains.",
    )

    # --- evaluation and review ------------------------------------------------------------
    eval_weights: dict[str, float] = Field(
        default_factory=lambda: {"faithfulness": 0.25, "relevance": 0.20, "correctness": 0.20, "coverage": 0.15,
                                 "consistency": 0.10, "freshness": 0.05, "traceability": 0.05},
        description="Weight of each metric in the overall score, as JSON.",
    )
    eval_freshness_half_life_days: float = Field(
        default=365.0, gt=0, description="A cited document this old scores 0.5 on freshness.")
    # Off by default: one more embedding per answer cost 30 ms of p95 and a third of the throughput
    # at concurrency 16 on XQuAD (docs/benchmarks.md), for relevance the lexical signals already judge.
    eval_similarity: bool = Field(default=False, description="Relevance also uses the local embedder's "
                                                             "question-answer cosine (one embedding per answer).")
    eval_llm_judge: bool = Field(default=True, description="With an LLM configured, also grade with the LLM judge.")
    eval_ragas: bool = Field(default=True, description="With an LLM configured, also grade with ragas "
                                                       "(needs the ragas extra).")
    eval_judge_budget_s: float = Field(default=60.0, gt=0, description="Time for the LLM judge and ragas together.")
    review_gate: Literal["deliver", "hold"] = Field(
        default="deliver",
        description="deliver: answers below the threshold are delivered and queued; hold: they wait for a reviewer.",
    )
    review_deliver_threshold: float = Field(default=0.80, ge=0, le=1, description="Overall at or above: no review.")
    review_high_priority_below: float = Field(default=0.60, ge=0, le=1,
                                              description="Overall below: queued with high priority.")
    review_metric_thresholds: dict[str, float] = Field(
        default_factory=lambda: {"faithfulness": 0.8, "relevance": 0.6, "correctness": 0.8, "coverage": 0.6,
                                 "consistency": 0.6, "freshness": 0.25, "traceability": 0.6},
        description="A metric below its threshold is named in the review reasons (and counts as flagged "
                    "for judge-human agreement).",
    )
    review_lease_s: float = Field(default=900.0, gt=0, description="How long a claim holds an item.")
    review_expire_after_days: float = Field(
        default=30.0, gt=0, description="Items pending longer than this are marked expired (checked lazily).")

    # --- prompt versions, experiments, the reviewer console -----------------------------------------
    prompt_cache_ttl_s: float = Field(
        default=30.0, gt=0, description="How long a process keeps a prompt label's version. A label move reaches "
                                        "every process at once by LISTEN/NOTIFY; this bounds staleness when that "
                                        "connection is down.")
    experiment_check_s: float = Field(
        default=60.0, ge=0, description="How often the server applies experiments' guardrail (0: only when a "
                                        "report is read).")
    console_session_hours: float = Field(default=8.0, gt=0, le=720,
                                         description="How long a reviewer console sign-in lasts.")
    promotion_requires_eval_run: bool = Field(
        default=False, description="Promoting a prompt or guidelines version to production needs a finished eval run "
                                   "made with it that does not regress production's run on the same data.")
    promotion_eval_tolerance: float = Field(
        default=0.02, ge=0, le=1, description="The promotion gate: how far a score metric (0-1) may drop, "
                                              "significantly, before promotion is refused.")
    promotion_eval_tolerances: dict[str, float] = Field(
        default_factory=lambda: {"latency_ms": 250.0, "cost_usd": 0.001},
        description="Per-metric tolerances in the metric's units (JSON), overriding promotion_eval_tolerance.")

    # --- jobs ------------------------------------------------------------------------------------
    serve_worker: Literal["auto", "on", "off"] = Field(
        default="auto", description="Run an ingestion worker inside `ragsvc serve` (auto: with the embedded DB)."
    )
    worker_heartbeat_s: float = Field(default=10.0, gt=0)
    job_stalled_after_s: float = Field(default=30.0, gt=0, description="A worker silent this long is dead.")

    # --- LLM (used by the generator and evaluator once they exist) --------------------------
    llm_base_url: str | None = None
    llm_api_key: SecretStr | None = None
    llm_model_simple: str = "gpt-4o-mini"
    llm_model_moderate: str = "gpt-4o-mini"
    llm_model_complex: str = "gpt-4o"
    llm_timeout_s: float = Field(default=30.0, gt=0)
    llm_usd_per_1k_prompt_tokens: float | None = Field(
        default=None, ge=0, description="The endpoint's price, for experiments' cost per answer (unset: tokens only).")
    llm_usd_per_1k_completion_tokens: float | None = Field(default=None, ge=0)

    # --- tracing: Langfuse when both keys are set (host: Langfuse Cloud unless given) ----------
    langfuse_host: str | None = None
    langfuse_public_key: SecretStr | None = None
    langfuse_secret_key: SecretStr | None = None
    langfuse_queue_size: int = Field(default=1000, ge=1, le=1_000_000, description=(
        "Traces waiting to be sent to Langfuse; one more is dropped (and counted in "
        "ragsvc_langfuse_traces_dropped_total) rather than slow a query."))
    langfuse_sample_rate: float = Field(default=1.0, ge=0, le=1, description=(
        "Share of queries traced in Langfuse (decided by query id, so an answer's late grades follow its "
        "trace); ingestion jobs and eval runs are always traced. Each traced query costs about 3 ms of CPU."))

    # --- HTTP -------------------------------------------------------------------------------
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65_535)

    @field_validator("database_url", mode="before")
    @classmethod
    def _coerce_database_url(cls, value: object) -> object:
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        if not isinstance(value, str):
            return value
        value = value.strip()
        for prefix in ("postgres://", "postgresql://", "postgresql+psycopg2://", "postgresql+asyncpg://"):
            if value.startswith(prefix):
                return "postgresql+psycopg://" + value[len(prefix) :]
        if not value.startswith("postgresql+psycopg://"):
            raise ValueError("must be a PostgreSQL URL such as postgresql://user:password@host:5432/dbname")
        return value

    @field_validator("answer_short_answer_parse", mode="before")
    @classmethod
    def _parse_depth(cls, value: object) -> object:
        # The setting was a boolean before it had depths: true meant the full parse. Whatever
        # pydantic reads as a boolean still means that.
        try:
            return "full" if _BOOL.validate_python(value) else "off"
        except ValidationError:
            return value.strip().lower() if isinstance(value, str) else value

    @field_validator("rate_limit")
    @classmethod
    def _rate_limit(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        from limits import parse_many

        try:
            parse_many(value)
        except ValueError as exc:
            raise ValueError(f"RAGSVC_RATE_LIMIT {value!r} is not a rate such as '600/minute' or "
                             f"'20/second;1000/hour' ({exc})") from None
        return value.strip()

    @field_validator("text_search_config")
    @classmethod
    def _check_text_search_config(cls, value: str) -> str:
        if not _IDENTIFIER.match(value):
            raise ValueError("must be a PostgreSQL text search configuration name such as 'english' or 'simple'")
        return value

    @field_validator("retrieval_strategies")
    @classmethod
    def _check_strategies(cls, value: str) -> str:
        names = [n.strip() for n in value.split(",") if n.strip()]
        if not names:
            raise ValueError(f"must list strategies from: {', '.join(strategy_names())}")
        return ",".join(check_strategy_names(names))

    @field_validator("fusion_weights")
    @classmethod
    def _check_weights(cls, value: dict[str, float]) -> dict[str, float]:
        if any(w < 0 for w in value.values()):
            raise ValueError("fusion weights must be >= 0")
        return value

    @field_validator("eval_weights", "review_metric_thresholds")
    @classmethod
    def _check_metric_map(cls, value: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(value) - set(METRICS))
        if unknown:
            raise ValueError(f"unknown metrics {unknown}; known: {', '.join(METRICS)}")
        if any(not 0 <= w <= 1 for w in value.values()):
            raise ValueError("values must be between 0 and 1")
        return value

    @field_validator("promotion_eval_tolerances")
    @classmethod
    def _check_tolerances(cls, value: dict[str, float]) -> dict[str, float]:
        bad = sorted(name for name, amount in value.items() if not (amount >= 0 and amount != float("inf")))
        if bad:
            raise ValueError(f"tolerances must be finite amounts >= 0 in the metric's units; check {bad}")
        return value

    @model_validator(mode="after")
    def _check_providers(self) -> Settings:
        if self.environment == "production" and self.database_url is None:
            # The embedded server lives in one machine's data dir: replicas and workers elsewhere
            # would each start their own and never see each other's documents.
            raise ValueError("RAGSVC_ENVIRONMENT=production needs RAGSVC_DATABASE_URL (the embedded PostgreSQL "
                             "is for development on one machine)")
        if self.embedding_provider == "openai" and not (self.embedding_base_url or self.llm_base_url):
            raise ValueError(
                "RAGSVC_EMBEDDING_PROVIDER=openai needs RAGSVC_EMBEDDING_BASE_URL (or RAGSVC_LLM_BASE_URL)"
            )
        if self.chunk_overlap >= self.chunk_size:
            raise ValueError("RAGSVC_CHUNK_OVERLAP must be smaller than RAGSVC_CHUNK_SIZE")
        if self.chunk_hierarchical and self.parent_chunk_size <= self.chunk_size:
            raise ValueError("RAGSVC_PARENT_CHUNK_SIZE must be larger than RAGSVC_CHUNK_SIZE")
        if self.embedding_provider == "local" and self.chunk_size > self.embedding_max_seq_length:
            raise ValueError(
                "RAGSVC_CHUNK_SIZE must not exceed RAGSVC_EMBEDDING_MAX_SEQ_LENGTH: the model would cut chunks short"
            )
        if self.review_high_priority_below > self.review_deliver_threshold:
            raise ValueError("RAGSVC_REVIEW_HIGH_PRIORITY_BELOW must not exceed RAGSVC_REVIEW_DELIVER_THRESHOLD")
        if self.reranker == "cohere" and self.cohere_api_key is None:
            raise ValueError("RAGSVC_RERANKER=cohere needs RAGSVC_COHERE_API_KEY")
        if self.embedding_provider == "local" and self.embedding_dimension != 384:
            raise ValueError("the local embedding model (all-MiniLM-L6-v2) has RAGSVC_EMBEDDING_DIMENSION=384")
        return self

    @property
    def default_strategies(self) -> tuple[str, ...]:
        return tuple(self.retrieval_strategies.split(","))

    @property
    def reranker_kind(self) -> str:
        """The reranker in use: 'auto' resolved by whether a Cohere key is set."""
        if self.reranker == "auto":
            return "cohere" if self.cohere_api_key is not None else "local"
        return self.reranker

    @property
    def embedded_database(self) -> bool:
        return self.database_url is None

    def secret_values(self) -> list[str]:
        """The configured secrets in clear, for the log redactor to replace wherever they appear."""
        keys = (self.embedding_api_key, self.cohere_api_key, self.llm_api_key, self.langfuse_secret_key)
        found = [key.get_secret_value() for key in keys if key is not None]
        password = re.search(r"://[^:/@\s]+:([^@\s]+)@", self.database_url or "")
        return found + ([password.group(1)] if password else [])

    @property
    def runs_serve_worker(self) -> bool:
        return self.serve_worker == "on" or (self.serve_worker == "auto" and self.embedded_database)


def load_settings(**overrides: object) -> Settings:
    """Build Settings from the environment (plus overrides), translating errors to ConfigError."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            field = ".".join(str(part) for part in err["loc"])
            name = f"{ENV_PREFIX}{field.upper()}" if field else "settings"
            if not field:
                problems.append(err["msg"])
                continue
            shown = err.get("input")
            if "key" in field:
                shown = "***"
            elif isinstance(shown, str) and "url" in field:
                shown = hide_password(shown)
            problems.append(f"{name}: {err['msg']} (got {shown!r})")
        raise ConfigError("Invalid configuration:\n  " + "\n  ".join(problems)) from None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide Settings. Tests call ``get_settings.cache_clear()`` after changing the env."""
    return load_settings()
