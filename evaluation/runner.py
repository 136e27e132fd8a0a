"""The eval runner: a dataset through the real service, one stored result per item as it finishes.

``create`` loads the dataset (its content hash is the run's dataset version), resolves the prompt and
guideline versions the run will answer with, snapshots the configuration and stores the run record.
``execute`` (the CLI at once, or any worker through the job queue) ingests the corpus into the run's
collection when needed (documents unchanged by hash are skipped, so a second run on the same data
ingests nothing), then runs every item not yet stored, ``concurrency`` at a time, writing each
result the moment it finishes. Run it again on the same run id (``ragsvc eval resume``) and it
continues where it stopped; items that failed are tried again.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import text

from evaluation.datasets import Dataset, golden_dataset, load_beir, load_qa, parse_dataset_spec
from evaluation.items import RETRIEVAL_DEPTH, EvalItem, full_item, retrieval_item
from evaluation.langfuse_export import LangfuseTarget, export_run
from evaluation.metrics import EVAL_EXTRA, AnswerMetrics, warm_up_ir_metrics
from evaluation.preparation import as_loaded, corpus_documents, eval_items, run_collection
from evaluation.snapshot import code_version, config_hash, snapshot
from evaluation.sources import GUIDELINES_PIN, EvalHistory, PinnedGuidelines, PinnedPrompts, pinnable
from evaluation.summary import summarise
from ingestion.pipeline import IngestOptions, Ingestor
from rag_service.config import Settings
from rag_service.db.repos.eval_runs import ALIVE_S, EvalRunRepository
from rag_service.db.repos.prompts import PromptRepository
from rag_service.domain import (
    DEFAULT_TENANT,
    DatasetRef,
    EvalItemResult,
    EvalRun,
    EvalRunRequest,
    collection_key,
    tenant_of,
)
from rag_service.domain.costs import Prices
from rag_service.errors import ConflictError, InvalidInputError, RagServiceError
from rag_service.observability.logs import request_id
from rag_service.observability.trace_tree import TraceExporter, TraceRecord, job_trace
from rag_service.pipeline.collaborators import GuidelineSource, PromptSource, QueryHistory, Retrieves
from rag_service.pipeline.orchestrator import QueryPipeline
from rag_service.stores.base import VectorStore

log = logging.getLogger(__name__)

# Called as (stage, done, total): stage is "ingest" (documents) or "items".
ProgressCallback = Callable[[str, int, int], None]
MakePipeline = Callable[[QueryHistory, PromptSource, GuidelineSource], QueryPipeline]


@dataclass
class RunnerParts:
    """What the runner needs from the process that hosts it (built by ``Runtime.eval_runner``)."""

    settings: Settings
    runs: EvalRunRepository
    prompts: PromptRepository
    retriever: Retrieves
    make_pipeline: MakePipeline
    make_ingestor: Callable[[], Ingestor]
    store: VectorStore
    answer_metrics: AnswerMetrics
    embedder_name: str
    generator: str  # "extractive", or the LLM's model names
    answer_prompt: str  # the prompt the configured generator answers with
    judge_prompt: str | None  # the LLM judge's prompt when it grades (its production version is recorded)
    prices: Prices
    golden_rows: Callable[[str | None], Awaitable[list[dict[str, Any]]]]  # a tenant's golden items
    db_engine: Any  # for VACUUM ANALYZE after a fresh ingest
    tracer: TraceExporter | None = None  # Langfuse, when its keys are set: one trace per run


JUDGE_VERSIONS = "judge_prompt_versions"


def run_trace(run: EvalRun, request_id: str | None = None) -> TraceRecord:
    """A started run as one Langfuse trace, its metric means as scores (the per-item traces and scores go
    to Langfuse as a dataset run: ``export_run``)."""
    means = {name: float(v["mean"]) for name, v in run.summary.items()
             if isinstance(v, dict) and isinstance(v.get("mean"), int | float) and not isinstance(v["mean"], bool)}
    return job_trace(
        run.id, kind="eval-run", started_at=run.started_at or run.created_at,
        ended_at=run.finished_at or datetime.now(UTC), status=run.status, error=run.error, request_id=request_id,
        scores=means,
        input={"dataset": run.dataset.model_dump(mode="json"), "mode": run.mode, "name": run.name,
               "config_hash": run.config_hash, "code_version": run.code_version, "seed": run.seed},
        output={"items_total": run.items_total, "items_done": run.items_done, "items_failed": run.items_failed})


class EvalRunner:
    def __init__(self, parts: RunnerParts) -> None:
        self._parts = parts

    # --- the record -----------------------------------------------------------------------------

    async def load(self, request: EvalRunRequest, tenant: str = DEFAULT_TENANT) -> Dataset:
        """The run's dataset; the golden dataset is the tenant's own reviewed answers."""
        kind, path = parse_dataset_spec(request.dataset)
        if kind == "beir":
            assert path is not None
            return await asyncio.to_thread(load_beir, path, request.split)
        if kind == "qa":
            assert path is not None
            return await asyncio.to_thread(load_qa, path)
        return golden_dataset(await self._parts.golden_rows(tenant))

    async def create(self, request: EvalRunRequest, created_by: str | None = None,
                     tenant: str = DEFAULT_TENANT) -> EvalRun:
        """Check and record a run (status queued) on a collection of ``tenant``; nothing is executed yet."""
        missing = [name for name in ("ranx", "ragas") if importlib.util.find_spec(name) is None]
        if missing:
            raise InvalidInputError(f"eval runs need {', '.join(missing)}: install the eval extra ({EVAL_EXTRA})")
        dataset = await self.load(request, tenant)
        kind, path = parse_dataset_spec(request.dataset)
        if path is not None:  # a worker, or a resume from another directory, must find the same files
            request = request.model_copy(update={"dataset": f"{kind}:{path.resolve()}"})
        items = eval_items(dataset, request.limit)
        prompts = await self._versions(request)
        config = snapshot(self._parts.settings, embedder=self._parts.embedder_name, generator=self._parts.generator,
                          prompts=prompts, mode=request.mode,
                          extra={"retrieval_depth": RETRIEVAL_DEPTH})
        ref = DatasetRef(kind=dataset.kind, name=dataset.name, version=dataset.version, split=dataset.split,
                         source=dataset.source, items=len(dataset))
        return await self._parts.runs.create(
            name=request.name, dataset=ref, request=request,
            collection=collection_key(tenant, run_collection(dataset, request)),
            config=config, config_hash=config_hash(config), code_version=code_version(),
            items_total=len(items) * request.repeat, created_by=created_by)

    async def _versions(self, request: EvalRunRequest) -> dict[str, int | None]:
        """The prompt and guideline versions this run answers with, resolved now and pinned for its
        whole execution (a queued or resumed run does not pick up later production moves). Only pins
        that change the run are accepted: the answering prompt and the guidelines, in full mode."""
        if request.mode == "retrieval":
            if request.prompts:
                raise InvalidInputError(f"prompts {sorted(request.prompts)} are not used in retrieval mode; run with "
                                        "mode full to measure a prompt or guidelines version")
            return {}  # retrieval reads no prompt: recording one would change the hash for nothing
        unused = sorted(set(request.prompts) - pinnable(self._parts.answer_prompt))
        if unused:
            raise InvalidInputError(f"prompts {unused} cannot be pinned in an eval run: this configuration answers "
                                    f"with {self._parts.answer_prompt!r} (and the {GUIDELINES_PIN!r})")
        try:
            versions: dict[str, int | None] = dict(await PinnedPrompts(self._parts.prompts, request.prompts).resolved(
                [self._parts.answer_prompt]))
            guidelines, _ = await PinnedGuidelines(self._parts.prompts, request.prompts.get(GUIDELINES_PIN)).current()
        except RagServiceError as exc:
            raise InvalidInputError(f"prompts: {exc}") from exc
        versions[GUIDELINES_PIN] = guidelines
        return versions

    # --- execution ------------------------------------------------------------------------------

    async def execute(self, run_id: uuid.UUID, progress: ProgressCallback | None = None, *,
                      force: bool = False, redo_failed: bool = False) -> EvalRun:
        """Run (or resume) a run to the end; returns the finished record. A failure outside the
        items (the dataset changed, the database went away) marks the run failed, resumable.
        ``redo_failed``: a finished run with failed items runs them again (an explicit resume only:
        a retried queue job must not change a finished run that may already be a gate's evidence)."""
        run = await self._parts.runs.start(run_id, force=force, redo_failed=redo_failed)
        judge = await self._judge_versions(run)
        beat = asyncio.create_task(self._heartbeat(run_id))
        try:
            dataset = await self.load(run.request, tenant_of(run.collection))
            if dataset.version != run.dataset.version:
                raise ConflictError(f"the dataset changed since the run was created (version {run.dataset.version}, "
                                    f"now {dataset.version}); start a new run on the new data")
            await self._ingest(dataset, run.collection, progress)
            await self._items(run, eval_items(dataset, run.request.limit), progress)
        except asyncio.CancelledError:
            raise  # interrupted: stays 'running'; resume continues it
        except Exception as exc:
            why = str(exc) if isinstance(exc, RagServiceError) else f"{type(exc).__name__}: {exc}"
            failed = await self._parts.runs.finish(
                run_id, summary=summarise(await self._parts.runs.results(run_id)) | judge, error=why)
            self._trace(failed)
            raise
        finally:
            beat.cancel()
        results = await self._parts.runs.results(run_id)
        finished = await self._parts.runs.finish(run_id, summary=summarise(results) | judge)
        self._trace(finished)
        target = LangfuseTarget.from_settings(self._parts.settings)
        if target is not None:  # no keys: nothing is sent, and nothing is said
            report = await export_run(target, finished, results)
            log.info("eval run %s sent to Langfuse as dataset run %s (%d items, %d scores, %d errors)",
                     run_id, report.run_name, report.items, report.scores, len(report.errors))
        return finished

    def _trace(self, run: EvalRun) -> None:
        if self._parts.tracer is None or run.started_at is None:
            return
        try:
            self._parts.tracer.submit(run_trace(run, request_id()))
        except Exception:  # tracing never fails a run
            log.exception("eval run %s not traced", run.id)

    async def _judge_versions(self, run: EvalRun) -> dict[str, Any]:
        """The LLM judge grades with production's judge prompt when the items run (it is not pinned):
        the versions seen, across resumes, go into the run's summary."""
        if self._parts.judge_prompt is None or run.mode != "full":
            return {}
        seen = set(run.summary.get(JUDGE_VERSIONS, []))
        seen |= set((await PinnedPrompts(self._parts.prompts, {}).resolved([self._parts.judge_prompt])).values())
        return {JUDGE_VERSIONS: sorted(seen)}

    async def _heartbeat(self, run_id: uuid.UUID) -> None:
        """Tell other processes the run is alive (``start`` refuses a second process within ALIVE_S), also
        through a long corpus ingest or slow items, when no result is being stored."""
        while True:
            await asyncio.sleep(ALIVE_S / 4)
            try:
                await self._parts.runs.heartbeat(run_id)
            except Exception:  # a missed beat at worst lets a forced resume in; the run goes on
                log.warning("eval run %s: heartbeat not stored", run_id, exc_info=True)

    async def _ingest(self, dataset: Dataset, collection: str, progress: ProgressCallback | None) -> None:
        documents = corpus_documents(dataset)
        if not documents:
            return

        def on_progress(p: Any) -> None:
            if progress is not None:
                progress("ingest", p.documents_done, len(documents))

        report = await self._parts.make_ingestor().ingest_documents(
            [as_loaded(d) for d in documents], IngestOptions(collection=collection, format="beir"), on_progress)
        if report.failed:
            raise InvalidInputError(f"{report.failed} corpus documents could not be ingested; first: "
                                    f"{report.errors[0] if report.errors else 'no detail'}")
        if report.added or report.updated:
            # Fresh rows: give the planner statistics now, as autovacuum would for a long-running server
            # (the tables ingestion fills, not the whole database another service may share).
            async with self._parts.db_engine.connect() as conn:
                conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
                await conn.execute(text("VACUUM ANALYZE documents, chunks, keyword_postings"))

    async def _items(self, run: EvalRun, items: Sequence[EvalItem], progress: ProgressCallback | None) -> None:
        done = await self._parts.runs.done(run.id)
        pending = [(position, item, repetition) for repetition in range(run.request.repeat)
                   for position, item in enumerate(items) if (item.id, repetition) not in done]
        total, finished = run.items_total, len(done)
        if progress is not None:
            progress("items", finished, total)
        run_one = self._item_function(run)
        if pending:
            await asyncio.to_thread(warm_up_ir_metrics)
        queue: asyncio.Queue[tuple[int, EvalItem, int]] = asyncio.Queue()
        for entry in pending:
            queue.put_nowait(entry)

        async def worker() -> None:
            nonlocal finished
            while True:
                try:
                    position, item, repetition = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                try:
                    result = await run_one(item, repetition)
                except Exception as exc:  # a step outside the item's own guard (its metrics): the item fails
                    log.warning("eval run %s: item %s failed", run.id, item.id, exc_info=True)
                    result = EvalItemResult(item_id=item.id, repetition=repetition, question=item.question,
                                            references=list(item.references), error=f"{type(exc).__name__}: {exc}")
                await self._parts.runs.record(run.id, position, result)
                finished += 1
                if progress is not None:
                    progress("items", finished, total)

        workers = [asyncio.create_task(worker()) for _ in range(min(run.request.concurrency, len(pending)) or 1)]
        try:
            await asyncio.gather(*workers)
        finally:
            for task in workers:
                task.cancel()
            for task in workers:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    def _item_function(self, run: EvalRun) -> Callable[[EvalItem, int], Awaitable[Any]]:
        parts = self._parts
        if run.mode == "retrieval":
            return lambda item, repetition: retrieval_item(parts.retriever, item, item.collection or run.collection,
                                                           repetition)
        history = EvalHistory()
        # Every version resolved when the run was created, production's included, is pinned.
        pins = {name: version for name, version in (run.config.get("prompts") or {}).items() if version is not None}
        pipeline = parts.make_pipeline(history, PinnedPrompts(parts.prompts, pins),
                                       PinnedGuidelines(parts.prompts, pins.get(GUIDELINES_PIN)))
        wait_for_grades = pipeline.evaluator.llm_grader is not None

        async def texts(chunk_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, str]:
            found = await parts.store.chunks_by_id(chunk_ids)
            return {chunk_id: hit.text for chunk_id, (hit, _) in found.items()}

        return lambda item, repetition: full_item(
            pipeline, item, run.collection, repetition, answer_metrics=parts.answer_metrics, context_texts=texts,
            prices=parts.prices, late_grades=history.late_grades, wait_for_grades=wait_for_grades)
