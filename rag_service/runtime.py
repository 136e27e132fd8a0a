"""Assembly of one process's parts: database, store, embedder, repositories, the retriever, the
query pipeline and the ingestor. Used by the API, CLI and workers.

This is the composition root: the one place that turns Settings into implementations, so the
edges never pick implementations themselves. It sits above every other layer (it builds them
all) and only the edges import it.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass
from functools import cached_property

from evaluation.jobs import consumer as eval_consumer
from evaluation.jobs import enqueue_run
from evaluation.metrics import AnswerMetrics
from evaluation.promotion import EvalPromotionGate
from evaluation.runner import EvalRunner, RunnerParts
from ingestion.chunking import Chunker, model_tokenizer
from ingestion.jobs import JobDeps, QueueConsumer, make_queue
from ingestion.pipeline import Ingestor
from rag_service import __version__
from rag_service.config import Settings
from rag_service.db import migrate
from rag_service.db.engine import Database, resolve_database_url
from rag_service.db.repos import ApiKeyRepository, DocumentCatalog, GuidelineRepository, JobRepository, QueryLog
from rag_service.db.repos.eval_runs import EvalRunRepository
from rag_service.db.repos.experiments import ExperimentRepository
from rag_service.db.repos.monitoring import MonitoringRepository
from rag_service.db.repos.prompts import PromptRepository
from rag_service.db.repos.reviews import ReviewRepository
from rag_service.db.repos.server import ServerInfoRepository
from rag_service.db.repos.traces import TraceRepository
from rag_service.domain import QueryTrace
from rag_service.domain.costs import Prices
from rag_service.domain.prompts import PRODUCTION
from rag_service.domain.status import DatabaseStatus, EmbeddingStatus, ServiceStatus
from rag_service.errors import RagServiceError, SchemaMismatchError
from rag_service.learning.optimizer import PROMPT_NAME as OPTIMIZER_PROMPT
from rag_service.learning.optimizer import rewriter
from rag_service.learning.service import LearningReviews, PromptService
from rag_service.observability.logs import Redactor
from rag_service.observability.metrics import ServiceMetrics
from rag_service.observability.tracing import LangfuseTracer
from rag_service.pipeline.collaborators import (
    GuidelineSource,
    PromptSource,
    QueryHistory,
)
from rag_service.pipeline.config import PipelineConfig
from rag_service.pipeline.evaluation import AnswerEvaluator, llm_grader
from rag_service.pipeline.generation.extractive import PROMPT_NAME as EXTRACTIVE_PROMPT
from rag_service.pipeline.generation.llm_generator import PROMPT_NAME as LLM_ANSWER_PROMPT
from rag_service.pipeline.generation.llm_generator import LLMGenerator
from rag_service.pipeline.guardrails import mask_pii
from rag_service.pipeline.intent import IntentParser
from rag_service.pipeline.orchestrator import QueryPipeline
from rag_service.pipeline.reporting import QueryReporting
from rag_service.pipeline.retrieval.retriever import Retriever, build_retriever
from rag_service.prompts.registry import Prompt, PromptRegistry
from rag_service.providers.embeddings import Embedder, TokenEncoder, make_embedder
from rag_service.providers.llm import OpenAICompatibleLLM, make_llm
from rag_service.providers.reader import default_reader
from rag_service.providers.syntax import default_parser
from rag_service.review.gate import GatePolicy
from rag_service.review.service import ReviewService
from rag_service.scoring.judge import PROMPT_NAME as JUDGE_PROMPT
from rag_service.scoring.ragas_scores import RagasConfig
from rag_service.stores.pgvector import PgVectorStore

log = logging.getLogger(__name__)


def database_url(settings: Settings) -> str:
    """External URL, or the embedded server's (started and migrated to head on first use)."""
    url = resolve_database_url(settings)
    if settings.embedded_database:
        # The embedded default has no operator to run migrations, so it upgrades itself.
        migrate.upgrade(url, settings)
    return url


@dataclass
class Runtime:
    settings: Settings
    db: Database
    store: PgVectorStore
    embedder: Embedder
    embedder_ready: bool = False
    embedder_error: str | None = None

    @classmethod
    def open(cls, settings: Settings) -> Runtime:
        """Connect (starting the embedded server if needed). Synchronous: call off the event loop."""
        db = Database.from_settings(settings, url=database_url(settings))
        return cls(settings=settings, db=db, store=PgVectorStore.from_settings(db, settings),
                   embedder=make_embedder(settings))

    @cached_property
    def catalog(self) -> DocumentCatalog:
        return DocumentCatalog(self.db)

    @cached_property
    def jobs(self) -> JobRepository:
        return JobRepository(self.db)

    @cached_property
    def prompt_repository(self) -> PromptRepository:
        return PromptRepository(self.db, ttl_s=self.settings.prompt_cache_ttl_s)

    @cached_property
    def prompts(self) -> PromptService:
        """Prompt and guideline versions, labels and experiments; chooses each query's prompt version."""
        s = self.settings
        gate = EvalPromotionGate(self.eval_runs, self.prompt_repository, required=s.promotion_requires_eval_run,
                                 tolerance=s.promotion_eval_tolerance, tolerances=s.promotion_eval_tolerances,
                                 answer_prompt=self.answer_prompt)
        return PromptService(self.prompt_repository, ExperimentRepository(self.db),
                             self.prices,
                             offline_gate=gate)

    @cached_property
    def learning(self) -> LearningReviews:
        """Review decisions with the candidates they yield, and ``propose``."""
        rewrite = rewriter(self.llm, lambda: self.production_prompt(OPTIMIZER_PROMPT)) if self.llm else None
        return LearningReviews(self.reviews, self.prompts, llm_rewrite=rewrite)

    async def production_prompt(self, name: str) -> Prompt:
        """The production version of a prompt; the shipped template if the database cannot say
        (a grading or a rewrite should not fail for that)."""
        try:
            version = await self.prompt_repository.by_label("prompt", name, PRODUCTION)
        except RagServiceError as exc:
            log.warning("could not read the production version of %s (%s); using the shipped template", name, exc)
            return PromptRegistry().get(name)
        return Prompt(version.name, version.version, version.body)

    @cached_property
    def guidelines(self) -> GuidelineRepository:
        return GuidelineRepository(self.prompt_repository)

    @cached_property
    def query_log(self) -> QueryLog:
        return QueryLog(self.db)

    @cached_property
    def keys(self) -> ApiKeyRepository:
        return ApiKeyRepository(self.db)

    @cached_property
    def reviews(self) -> ReviewService:
        """The review queue (claims, decisions, statistics) and the answers' read side with feedback."""
        s = self.settings
        return ReviewService(ReviewRepository(self.db), lease_s=s.review_lease_s,
                             expire_after_s=s.review_expire_after_days * 86_400, mask=mask_pii)

    @cached_property
    def llm(self) -> OpenAICompatibleLLM | None:
        """The configured OpenAI-compatible LLM, or None (every caller has a path without one)."""
        return make_llm(self.settings)

    @cached_property
    def retriever(self) -> Retriever:
        return build_retriever(self.settings, self.store, self.embedder, self.llm,
                               count_chunks=self.catalog.searchable_chunks)

    @cached_property
    def pipeline(self) -> QueryPipeline:
        """The query pipeline (guardrails, intent, router, retrieval, generation) for this process."""
        return self.build_pipeline(self.query_log, self.prompts, self.guidelines, reporting=self.reporting)

    @cached_property
    def reporting(self) -> QueryReporting:
        """Who hears of each query this process's pipeline finishes: metrics, stored traces, Langfuse."""
        return QueryReporting(observe=self.metrics.observe_query, traces=self.traces, export=self.tracer,
                              prices=self.prices, budget_s=PipelineConfig().persist_budget_s)

    @cached_property
    def tracer(self) -> LangfuseTracer | None:
        """Langfuse tracing when its keys are set, else None (and nothing is sent)."""
        # Secrets only: what comes from users (question, answer, route, errors) is PII-masked before it is
        # queued, and masking identifiers too would corrupt some (a UUID can look like a phone number).
        secrets = self.settings.secret_values()
        return LangfuseTracer.from_settings(self.settings, redact=Redactor(secrets),
                                            redact_message=Redactor(secrets, mask_personal=mask_pii),
                                            on_drop=self.metrics.langfuse_dropped.inc)

    @cached_property
    def traces(self) -> TraceRepository:
        return TraceRepository(self.db)

    async def query_trace(self, query_id: uuid.UUID) -> QueryTrace:
        """The stored trace of ``query_id``, waiting for it when this process's pipeline is still
        writing it (traces are written after the answer); NotFoundError when there is none. Another
        process (a replica, a CLI run) does not wait: there a trace a few ms old may not be found."""
        if "reporting" in self.__dict__:  # a process that has answered nothing has no write in flight
            await self.reporting.written(query_id)
        return await self.traces.get(query_id)

    @cached_property
    def metrics(self) -> ServiceMetrics:
        """This process's Prometheus metrics (GET /metrics)."""
        found = ServiceMetrics()
        found.prices = self.prices
        return found

    @property
    def answer_prompt(self) -> str:
        """The prompt this configuration answers with: the LLM's, or the extractive answerer's."""
        return LLM_ANSWER_PROMPT if self.llm is not None else EXTRACTIVE_PROMPT

    @cached_property
    def prices(self) -> Prices:
        return Prices(self.settings.llm_usd_per_1k_prompt_tokens, self.settings.llm_usd_per_1k_completion_tokens)

    @cached_property
    def monitoring(self) -> MonitoringRepository:
        return MonitoringRepository(self.db)

    def build_pipeline(self, query_log: QueryHistory, prompts: PromptSource, guidelines: GuidelineSource,
                       reporting: QueryReporting | None = None) -> QueryPipeline:
        """A pipeline on this process's parts with the given history, prompt and guideline sources
        (an eval run answers without storing anything, with the versions it pins, and is not counted
        in the service's metrics nor traced per query: no ``reporting``)."""
        s = self.settings
        return QueryPipeline(
            retriever=self.retriever, collections=self.catalog, guidelines=guidelines,
            query_log=query_log,
            generator=LLMGenerator(self.llm) if self.llm is not None else None,
            parser=self.intent_parser, intent_llm=self.llm,
            evaluator=self.evaluator, prompts=prompts, reporting=reporting,
            token_encoder=self.embedder if s.answer_token_alignment and isinstance(self.embedder, TokenEncoder)
            else None,
            syntax_parser=default_parser(s.answer_short_answer_parse) if s.answer_short_answer_parse != "off" else None,
            span_reader=default_reader() if s.answer_reader else None,
            config=PipelineConfig(retrieve_budget_s=s.query_retrieve_budget_s, judge_budget_s=s.eval_judge_budget_s,
                                  generate_budget_s=s.query_generate_budget_s, history_turns=s.conversation_turns,
                                  candidates=s.query_retrieval_candidates, strategies=s.default_strategies,
                                  abstain_below=s.answer_abstain_below),
        )

    @cached_property
    def eval_runs(self) -> EvalRunRepository:
        return EvalRunRepository(self.db)

    @cached_property
    def eval_runner(self) -> EvalRunner:
        """Offline evaluation runs over this process's retriever and pipeline."""
        s = self.settings
        llm = self.llm
        return EvalRunner(RunnerParts(
            settings=s, runs=self.eval_runs, prompts=self.prompt_repository, retriever=self.retriever,
            make_pipeline=self.build_pipeline, make_ingestor=self.ingestor, store=self.store,
            answer_metrics=AnswerMetrics(embed=self.embedder.embed, llm=RagasConfig.from_settings(s)),
            embedder_name=self.embedder.name,
            generator=f"llm:{s.llm_model_simple},{s.llm_model_moderate},{s.llm_model_complex}" if llm else "extractive",
            answer_prompt=self.answer_prompt,
            judge_prompt=JUDGE_PROMPT if llm and s.eval_llm_judge else None,
            prices=self.prices,
            golden_rows=self.eval_runs.golden_rows, db_engine=self.db.engine, tracer=self.tracer))

    @cached_property
    def intent_parser(self) -> IntentParser:
        return IntentParser(ambiguity_threshold=self.settings.clarify_ambiguity_threshold)

    @cached_property
    def evaluator(self) -> AnswerEvaluator:
        """The seven-metric evaluator and the review gate, as configured."""
        s = self.settings
        policy = GatePolicy(deliver_at=s.review_deliver_threshold, high_priority_below=s.review_high_priority_below,
                            metric_thresholds=s.review_metric_thresholds, mode=s.review_gate)
        grader = None
        if self.llm is not None:
            grader = llm_grader(self.llm if s.eval_llm_judge else None, lambda: self.production_prompt(JUDGE_PROMPT),
                                RagasConfig.from_settings(s), self.embedder.embed, s.eval_judge_budget_s)
        return AnswerEvaluator(weights=s.eval_weights, half_life_days=s.eval_freshness_half_life_days, policy=policy,
                               embed=self.embedder.embed if s.eval_similarity else None, llm_grader=grader)

    def ingestor(self) -> Ingestor:
        s = self.settings
        chunker = Chunker(model_tokenizer(), chunk_size=s.chunk_size, chunk_overlap=s.chunk_overlap,
                          hierarchical=s.chunk_hierarchical, parent_chunk_size=s.parent_chunk_size)
        # Changing how documents are chunked or embedded must re-process them.
        signature = "/".join(map(str, (s.chunk_size, s.chunk_overlap, s.chunk_hierarchical, s.parent_chunk_size,
                                       self.embedder.name)))
        return Ingestor(self.store, self.catalog, self.embedder, chunker, signature)

    def job_deps(self) -> JobDeps:
        """What ingestion workers need from this process."""
        return JobDeps(jobs=self.jobs, make_ingestor=self.ingestor, tracer=self.tracer)

    def other_jobs(self) -> tuple[QueueConsumer, ...]:
        """The job kinds a worker runs besides ingestion: eval runs."""
        return (eval_consumer(self.eval_runner),)

    async def enqueue_eval_run(self, run_id: uuid.UUID) -> None:
        """Defer a recorded eval run to the workers (from a process without an open queue: the CLI)."""
        queue = make_queue(self.db.url)
        try:
            async with queue.open_async():
                await enqueue_run(queue, run_id, self.eval_runs)
        except Exception as exc:  # the queue could not be opened: the run must not stay 'queued'
            run = await self.eval_runs.get(run_id)
            if run.status == "queued":
                await self.eval_runs.finish(run_id, summary={}, error=f"could not be queued: {type(exc).__name__}: "
                                                                      f"{exc}")
            raise

    async def warm_up_embedder(self) -> None:
        """Load the embedding model; records failure instead of raising, for /readyz to report. (The
        token encoder's int8 copy is made at the first answer that needs it, about a second: made
        here, in a thread that outlives a cancelled warm-up, it overlapped whatever ran next.)"""
        try:
            await self.embedder.warm_up()
        except RagServiceError as exc:
            self.embedder_error = str(exc)
            log.error("embedder failed to load: %s", exc)
        except Exception as exc:  # a broken provider must not take the process down
            self.embedder_error = f"{type(exc).__name__}: {exc}"
            log.exception("embedder failed to load")
        else:
            self.embedder_ready = True
            self.embedder_error = None

    async def close(self) -> None:
        if "pipeline" in self.__dict__:  # traces written after their answers (a no-op once drained)
            await self.pipeline.drain(timeout_s=5)
        if "tracer" in self.__dict__ and self.tracer is not None:  # send what is queued, within a bound
            await asyncio.to_thread(self.tracer.close)
        if "prompt_repository" in self.__dict__:
            await self.prompt_repository.close()
        if "llm" in self.__dict__ and self.llm is not None:  # only if it was ever made
            await self.llm.close()
        await self.embedder.close()
        await self.store.close()
        await self.db.dispose()

    async def readiness(self) -> tuple[bool, dict[str, str]]:
        """(ready, reason per component) for /readyz."""
        checks: dict[str, str] = {}
        try:
            await asyncio.wait_for(self.check_schema(), timeout=5)
            checks["database"] = "ok"
        except TimeoutError:
            checks["database"] = "database did not answer within 5 s"
        except RagServiceError as exc:
            checks["database"] = str(exc)
        if self.embedder_ready:
            checks["embedder"] = "ok"
        else:
            checks["embedder"] = self.embedder_error or "loading"
        return all(v == "ok" for v in checks.values()), checks

    async def check_schema(self) -> None:
        current = await ServerInfoRepository(self.db).schema_revision()
        head = migrate.head_revision()
        if current != head:
            raise SchemaMismatchError(
                f"database schema is at revision {current or 'none'}, this version needs {head}; "
                "run `ragsvc db upgrade`"
            )
        schema = await self.store.schema()
        if schema.embedding_dimension != self.embedder.dimension:
            raise SchemaMismatchError(
                f"the database holds {schema.embedding_dimension}-d vectors but the embedder "
                f"{self.embedder.name} makes {self.embedder.dimension}-d ones"
            )

    async def status(self) -> ServiceStatus:
        server = await ServerInfoRepository(self.db).info()
        revision = server.schema_revision
        counts = await self.catalog.counts() if revision else None
        schema = await self.store.schema() if revision else None
        return ServiceStatus(
            version=__version__,
            database=DatabaseStatus(
                url=self.db.display_url, embedded=self.settings.embedded_database,
                server_version=server.server_version, pgvector_version=server.pgvector_version,
                schema_revision=revision, schema_head=migrate.head_revision(),
                text_search_config=schema.text_search_config if schema else None,
                pg_trgm=schema.has_trgm if schema else None,
            ),
            embedding=EmbeddingStatus(
                provider=self.settings.embedding_provider, model=self.embedder.name,
                dimension=self.embedder.dimension,
                stored_dimension=schema.embedding_dimension if schema else None,
            ),
            counts=counts,
        )
