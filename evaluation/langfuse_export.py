"""Send an offline evaluation run to Langfuse as a *dataset run*, with one numeric score per metric.

When ``RAGSVC_LANGFUSE_PUBLIC_KEY`` and ``RAGSVC_LANGFUSE_SECRET_KEY`` are set (``RAGSVC_LANGFUSE_HOST``
defaults to Langfuse's own default, https://cloud.langfuse.com), :func:`export_run` mirrors a finished
:class:`~rag_service.domain.eval_runs.EvalRun` into Langfuse; without the keys
:meth:`LangfuseTarget.from_settings` returns None and nothing is sent. The export never raises past
:func:`export_run`: failures (Langfuse down, wrong keys, a rejected event) end up in
:attr:`ExportReport.errors`, each naming the endpoint and the status, and are logged once, as a warning.
Keys never appear in a log record, an error or a repr.

What is sent, in this order (Langfuse's public REST API, Basic auth: username the public key, password
the secret key), straight over httpx rather than the SDK (v3+ of which is OpenTelemetry-based):

1. ``POST /api/public/v2/datasets`` ``{name, description, metadata}``: upserts the dataset by name (200,
   the dataset object with its ``id``). Name: ``ragsvc/{kind}/{name}[:{split}]@{version}``; a ``/``
   puts a Langfuse dataset in a folder, so the three slash-separated parts are the folders
   ``ragsvc/{kind}`` and the dataset itself. Langfuse refuses names that start or end with ``/``, hold
   ``//`` or an HTML tag, so slashes and angle brackets inside the parts become ``_``.
2. ``POST /api/public/dataset-items`` ``{datasetName, id, input, expectedOutput, metadata}``, one per
   item: "Dataset items are upserted on their id. Id needs to be unique (project-level) and cannot be
   reused across datasets", so the id is a UUIDv5 of the dataset name (which holds the content version)
   and the item id: re-exports upsert instead of duplicating. ``input`` is ``{question}``,
   ``expectedOutput`` ``{references}`` when the item has references.
3. ``POST /api/public/ingestion`` ``{batch: [...]}``: one ``trace-create`` per result (item x repetition)
   and one ``score-create`` (``{id, traceId, name, value, dataType: "NUMERIC", comment}``) per metric
   whose value is a finite number, ``batch_size`` events (and under 3 MB) a request. The answer is 207
   ``{successes: [{id, status}], errors: [{id, status, message, error}]}``: an error there is one event
   rejected, reported as such. Both event types "upsert on id" (the body id); trace and score ids are
   UUIDv5s of the run id, item, repetition (and metric), the envelope ids fresh UUIDv4s (Langfuse
   deduplicates on those within a request).
4. ``GET /api/public/dataset-run-items?datasetId=&runName=&page=&limit=``: the run's items already in
   Langfuse (404 when the run does not exist yet), so a re-export does not link a trace twice:
   Langfuse makes run item ids itself ("currently we do not accept user defined ids").
5. ``POST /api/public/dataset-run-items`` ``{runName, runDescription, metadata, datasetItemId, traceId}``
   per result whose dataset item and trace were accepted; the run is created by the first one
   (``metadata`` and ``runDescription`` update it). Run name: ``run.name``, else the run id.

Where the endpoints and fields were checked (github.com/langfuse/langfuse):
``fern/apis/server/definition/{datasets,dataset-items,dataset-run-items,ingestion}.yml`` (the API
definition the OpenAPI spec and SDKs are generated from); ``web/src/features/public-api/types/datasets.ts``
(request/response schemas: ``PostDatasetRunItemsV1Body`` is ``.strict()``, so no other keys are sent);
``web/src/pages/api/public/v2/datasets/index.ts`` and ``web/src/features/datasets/server/actions/
createDataset.ts`` (upsert by name, ``DatasetNameSchema``); ``packages/shared/src/features/folders/
validation.ts`` and ``packages/shared/src/utils/zod.ts`` (dataset name rules);
``web/src/pages/api/public/dataset-run-items.ts`` (the dataset item must exist and be ACTIVE, else 404;
the run item id is generated); ``web/src/pages/api/public/ingestion.ts`` (207 with per-event errors,
401/403 as ``{error, message}``); ``packages/shared/src/server/ingestion/types.ts`` (ids 1-800 characters,
event timestamps ISO 8601 *with* an offset, trace names at most 1,000 characters, score names only
non-empty); ``web/src/features/public-api/server/createAuthedProjectAPIRoute.ts`` (401 as ``{message}``).

Score names are sent as the metrics are named here (``ndcg@10``, ``faithfulness``): the ingestion API
takes any non-empty name. Only a score *config* (not used here) restricts names, to letters, digits,
space and ``.()-``, at most 35 characters (``packages/shared/src/domain/score-configs.ts``).

Deprecation: ``/api/public/ingestion`` is Langfuse's "legacy" ingestion path and ``/dataset-run-items``
is deprecated with Langfuse v4 (the fern definitions announce their removal from Langfuse Cloud in late
2026; self-hosted v3 keeps them). A v4 deployment in ``events_only`` mode answers trace-create events
with per-event 400s: this export then reports them, and links no run items for those traces.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import httpx

from rag_service.domain.eval_runs import EvalItemResult, EvalRun

log = logging.getLogger(__name__)

DEFAULT_HOST = "https://cloud.langfuse.com"  # Langfuse's own default (the SDKs' LANGFUSE_HOST)
DEFAULT_TIMEOUT_S = 10.0
MAX_BATCH_BYTES = 3_000_000  # Langfuse limits an ingestion request to 3.5 MB
MAX_ERRORS = 50  # errors kept in the report; the rest are counted
_NAMESPACE = uuid.UUID("6f1d3c1e-5b7a-4c55-9a51-6b0b3f7f2a10")  # fixed: ids must not change between exports
_PAGE_LIMIT = 100


@dataclass(frozen=True)
class LangfuseTarget:
    """Where to send, and the keys. The keys stay out of the repr (and so out of logs)."""

    host: str
    public_key: str = field(repr=False)
    secret_key: str = field(repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "host", self.host.strip().rstrip("/"))

    @classmethod
    def from_settings(cls, settings: Any) -> LangfuseTarget | None:
        """None unless both keys are set. No host: Langfuse's own default, https://cloud.langfuse.com
        (what the Langfuse SDKs assume too)."""
        public_key = _secret(getattr(settings, "langfuse_public_key", None))
        secret_key = _secret(getattr(settings, "langfuse_secret_key", None))
        if not public_key or not secret_key:
            if public_key or secret_key:
                log.warning("Langfuse export is off: it needs both RAGSVC_LANGFUSE_PUBLIC_KEY and "
                            "RAGSVC_LANGFUSE_SECRET_KEY, and only one is set")
            return None
        host = (getattr(settings, "langfuse_host", None) or "").strip() or DEFAULT_HOST
        return cls(host=host, public_key=public_key, secret_key=secret_key)


@dataclass
class ExportReport:
    """What reached Langfuse: dataset items upserted, scores accepted, and every failure."""

    dataset: str
    run_name: str
    items: int = 0
    scores: int = 0
    errors: list[str] = field(default_factory=list)
    traces: int = 0
    run_items: int = 0

    @property
    def ok(self) -> bool:
        return not self.errors


def dataset_name(run: EvalRun) -> str:
    """``ragsvc/{kind}/{name}[:{split}]@{version}``: the folder ragsvc/{kind}, then one dataset per
    dataset file, split and content version."""
    ref = run.dataset
    leaf = _name_part(ref.name) + (f":{_name_part(ref.split)}" if ref.split else "") + f"@{_name_part(ref.version)}"
    return f"ragsvc/{_name_part(ref.kind)}/{leaf}"


def run_name(run: EvalRun) -> str:
    return (run.name or "").strip() or str(run.id)


def dataset_item_id(dataset: str, item_id: str) -> str:
    """Stable across exports, distinct across datasets (Langfuse item ids are project-wide)."""
    return str(uuid.uuid5(_NAMESPACE, f"dataset-item\n{dataset}\n{item_id}"))


def trace_id(run: EvalRun, result: EvalItemResult) -> str:
    """32 lowercase hex characters (also a valid W3C trace id), stable for a run, item and repetition."""
    return uuid.uuid5(_NAMESPACE, f"trace\n{run.id}\n{result.item_id}\n{result.repetition}").hex


def score_id(trace: str, metric: str) -> str:
    return str(uuid.uuid5(_NAMESPACE, f"score\n{trace}\n{metric}"))


async def export_run(target: LangfuseTarget, run: EvalRun, results: Sequence[EvalItemResult], *,
                     client: httpx.AsyncClient | None = None, batch_size: int = 100,
                     timeout_s: float = DEFAULT_TIMEOUT_S, concurrency: int = 8) -> ExportReport:
    """Upsert the dataset and its items, send a trace and the scores per result, link them as the run.

    Never raises for anything Langfuse does (or fails to do): see :attr:`ExportReport.errors`. A failure
    that makes every further request pointless (no connection, a timeout, 401/403, the dataset refused)
    stops the export there, so a dead server costs one error rather than one per item."""
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    exporter = _Exporter(target, run, results, batch_size=batch_size, timeout_s=timeout_s,
                         concurrency=max(1, concurrency))
    owned = client is None
    http = client or httpx.AsyncClient(timeout=timeout_s)
    try:
        await exporter.run(http)
    except Exception as exc:  # a bug here must not fail the evaluation run either
        exporter.fail(f"export stopped: {type(exc).__name__}: {exporter.scrub(str(exc))[:200]}", stop=True)
    finally:
        if owned:
            await http.aclose()
    report = exporter.report
    if report.errors:
        log.warning("Langfuse export of run %s to %s (dataset %s, run %s) had %d error(s); first: %s",
                    run.id, target.host, report.dataset, report.run_name, exporter.error_count, report.errors[0])
    else:
        log.info("Langfuse export of run %s: %d dataset items, %d traces, %d run items, %d scores (dataset %s)",
                 run.id, report.items, report.traces, report.run_items, report.scores, report.dataset)
    return report


class _Stop(Exception):
    """Raised inside the export when nothing further can succeed."""


class _Exporter:
    def __init__(self, target: LangfuseTarget, run: EvalRun, results: Sequence[EvalItemResult], *,
                 batch_size: int, timeout_s: float, concurrency: int) -> None:
        self.target = target
        self.run_ = run
        self.results = list(results)
        self.batch_size = batch_size
        self.timeout = httpx.Timeout(timeout_s)
        self.semaphore = asyncio.Semaphore(concurrency)
        self.auth = httpx.BasicAuth(target.public_key, target.secret_key)
        self.dataset = dataset_name(run)
        self.run_name = run_name(run)
        self.report = ExportReport(dataset=self.dataset, run_name=self.run_name)
        self.error_count = 0
        self.stopped = False
        self.http: httpx.AsyncClient

    # --- the steps -----------------------------------------------------------------------------------
    async def run(self, http: httpx.AsyncClient) -> None:
        self.http = http
        try:
            dataset = await self.post("/api/public/v2/datasets", self.dataset_body(), stop_on_error=True)
            if dataset is None:
                return
            items = await self.upsert_items()
            traces = await self.ingest()
            existing = await self.existing_run_items(dataset.get("id"))
            await self.link(items, traces, existing)
        except _Stop:
            return

    def dataset_body(self) -> dict[str, Any]:
        ref = self.run_.dataset
        return {
            "name": self.dataset,
            "description": f"rag-service evaluation dataset {ref.kind}:{ref.name}"
                           + (f" (split {ref.split})" if ref.split else "") + f", content version {ref.version}",
            "metadata": _json_safe({"source": "rag-service", "kind": ref.kind, "name": ref.name,
                                    "version": ref.version, "split": ref.split, "items": ref.items}),
        }

    async def upsert_items(self) -> set[str]:
        """Dataset item id -> accepted; one request per item (the API has no batch form)."""
        firsts: dict[str, EvalItemResult] = {}
        for result in self.results:
            firsts.setdefault(result.item_id, result)
        ref = self.run_.dataset

        async def one(result: EvalItemResult) -> str | None:
            item_id = dataset_item_id(self.dataset, result.item_id)
            body: dict[str, Any] = {
                "datasetName": self.dataset,
                "id": item_id,
                "input": {"question": result.question},
                "metadata": {"item_id": result.item_id, "dataset_kind": ref.kind, "dataset_name": ref.name,
                             "dataset_version": ref.version, "split": ref.split},
            }
            if result.references:
                body["expectedOutput"] = {"references": list(result.references)}
            answer = await self.post("/api/public/dataset-items", body)
            return item_id if answer is not None else None

        done = await self.gather(one(r) for r in firsts.values())
        accepted = {item for item in done if item}
        self.report.items = len(accepted)
        return accepted

    async def ingest(self) -> set[str]:
        """Traces and scores in batches; returns the trace ids Langfuse accepted."""
        events: list[tuple[dict[str, Any], bytes]] = []
        for result in self.results:
            trace = trace_id(self.run_, result)
            events.append(self.event("trace-create", self.trace_body(trace, result)))
            for metric, value in result.metrics.items():
                if value is None or not math.isfinite(value) or not metric.strip():
                    continue
                body: dict[str, Any] = {"id": score_id(trace, metric), "traceId": trace, "name": metric.strip(),
                                        "value": float(value), "dataType": "NUMERIC"}
                if scorer := result.scorers.get(metric):
                    body["comment"] = f"scorer: {scorer}"
                events.append(self.event("score-create", body))
        accepted: set[str] = set()
        for batch in _batches(events, self.batch_size, MAX_BATCH_BYTES):
            kinds = {event["id"]: (event["type"], event["body"]["id"]) for event, _ in batch}
            content = b'{"batch":[' + b",".join(raw for _, raw in batch) + b"]}"
            answer = await self.post("/api/public/ingestion", content=content, ok_statuses=(200, 201, 207))
            if answer is None:
                continue
            for success in answer.get("successes") or []:
                kind, body_id = kinds.get(success.get("id"), (None, None))
                if kind == "trace-create":
                    accepted.add(body_id)
                    self.report.traces += 1
                elif kind == "score-create":
                    self.report.scores += 1
            for error in answer.get("errors") or []:
                kind, body_id = kinds.get(error.get("id"), ("event", error.get("id")))
                detail = "; ".join(str(part) for part in (error.get("message"), error.get("error")) if part)
                self.fail(f"POST /api/public/ingestion: {kind} {body_id} rejected with status "
                          f"{error.get('status')}" + (f" ({self.scrub(detail)[:200]})" if detail else ""))
        return accepted

    def trace_body(self, trace: str, result: EvalItemResult) -> dict[str, Any]:
        run = self.run_
        retrieved = [ref.id for ref in sorted(result.retrieved, key=lambda ref: ref.rank)]
        output: dict[str, Any] = {"retrieved": retrieved}
        if result.answer is not None:
            output = {"answer": result.answer, "short_answer": result.short_answer, "retrieved": retrieved}
        metadata = {
            "run_id": str(run.id), "item_id": result.item_id, "repetition": result.repetition,
            "outcome": result.outcome, "latency_ms": result.latency_ms, "relevant_rank": result.relevant_rank,
            "tokens": result.tokens, "cost_usd": result.cost_usd, "error": result.error,
            "config_hash": run.config_hash, "dataset": self.dataset,
        }
        body: dict[str, Any] = {
            "id": trace,
            "timestamp": _iso(run.started_at or run.created_at),
            "name": f"ragsvc eval {run.mode}"[:1000],
            "sessionId": str(run.id),
            "input": {"question": result.question},
            "output": output,
            "metadata": metadata,
            "tags": ["ragsvc-eval", f"mode:{run.mode}"],
            "version": run.config_hash,
        }
        if run.code_version:
            body["release"] = run.code_version
        return body

    async def existing_run_items(self, dataset_id: Any) -> set[tuple[str, str]]:
        """(dataset item id, trace id) pairs the run already links; empty when the run is new."""
        pairs: set[tuple[str, str]] = set()
        if not isinstance(dataset_id, str) or not dataset_id:
            return pairs
        page = 1
        while True:
            answer = await self.get("/api/public/dataset-run-items", {
                "datasetId": dataset_id, "runName": self.run_name, "page": page, "limit": _PAGE_LIMIT})
            if not answer:
                return pairs
            for row in answer.get("data") or []:
                pairs.add((row.get("datasetItemId"), row.get("traceId")))
            total_pages = (answer.get("meta") or {}).get("totalPages") or 0
            if page >= total_pages or not answer.get("data"):
                return pairs
            page += 1

    async def link(self, items: set[str], traces: set[str], existing: set[tuple[str, str]]) -> None:
        run = self.run_
        metadata = _json_safe({
            "run_id": str(run.id), "status": run.status, "mode": run.mode, "collection": run.collection,
            "config_hash": run.config_hash, "code_version": run.code_version, "seed": run.seed,
            "items_total": run.items_total, "items_failed": run.items_failed, "summary": run.summary,
        })
        description = f"rag-service evaluation run {run.id} ({run.mode}, config {run.config_hash})"

        async def one(result: EvalItemResult) -> bool:
            item = dataset_item_id(self.dataset, result.item_id)
            trace = trace_id(run, result)
            if item not in items or trace not in traces:
                return False  # its item or trace was refused: already reported
            if (item, trace) in existing:
                return True
            body = {"runName": self.run_name, "runDescription": description, "metadata": metadata,
                    "datasetItemId": item, "traceId": trace}
            return await self.post("/api/public/dataset-run-items", body) is not None

        linked = await self.gather(one(r) for r in self.results)
        self.report.run_items = sum(1 for ok in linked if ok)

    # --- HTTP ----------------------------------------------------------------------------------------
    def event(self, kind: str, body: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        event = {"id": str(uuid.uuid4()), "type": kind, "timestamp": _iso(datetime.now(UTC)),
                 "body": _json_safe(body)}
        return event, _dumps(event)

    async def gather(self, calls: Iterable[Any]) -> list[Any]:
        async def bounded(call: Any) -> Any:
            async with self.semaphore:
                if self.stopped:
                    call.close()
                    return None
                return await call

        results = await asyncio.gather(*(bounded(c) for c in calls), return_exceptions=True)
        if self.stopped:
            raise _Stop
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, _Stop):
                raise result
        return [None if isinstance(r, BaseException) else r for r in results]

    async def post(self, path: str, body: Any = None, *, content: bytes | None = None,
                   ok_statuses: tuple[int, ...] = (200, 201), stop_on_error: bool = False) -> dict[str, Any] | None:
        if content is None:
            content = _dumps(_json_safe(body))
        return await self.send("POST", path, content=content, ok_statuses=ok_statuses, stop_on_error=stop_on_error)

    async def get(self, path: str, params: dict[str, Any]) -> dict[str, Any] | None:
        return await self.send("GET", path, params=params, ok_statuses=(200,), missing_ok=True)

    async def send(self, method: str, path: str, *, content: bytes | None = None, params: dict[str, Any] | None = None,
                   ok_statuses: tuple[int, ...], stop_on_error: bool = False,
                   missing_ok: bool = False) -> dict[str, Any] | None:
        if self.stopped:
            raise _Stop
        endpoint = f"{method} {path}"
        headers = {"Accept": "application/json"}
        if content is not None:
            headers["Content-Type"] = "application/json"
        try:
            response = await self.http.request(method, self.target.host + path, content=content, params=params,
                                               headers=headers, auth=self.auth, timeout=self.timeout)
        except httpx.TimeoutException:
            self.fail(f"{endpoint}: no answer from {_where(self.target.host)} within "
                      f"{self.timeout.read or self.timeout.connect}s (timed out)", stop=True)
            raise _Stop from None
        except httpx.HTTPError as exc:
            self.fail(f"{endpoint}: request to {_where(self.target.host)} failed ({type(exc).__name__}: "
                      f"{self.scrub(str(exc))[:200]})", stop=True)
            raise _Stop from None
        if response.status_code in ok_statuses:
            try:
                payload = response.json()
            except ValueError:
                payload = {}
            return payload if isinstance(payload, dict) else {}
        if missing_ok and response.status_code == 404:
            return None
        stop = stop_on_error or response.status_code in (401, 403)
        self.fail(f"{endpoint}: HTTP {response.status_code}{self.detail(response)}", stop=stop)
        if stop:
            raise _Stop
        return None

    def detail(self, response: httpx.Response) -> str:
        try:
            payload = response.json()
        except ValueError:
            text = response.text.strip()
            return f" ({self.scrub(text)[:200]})" if text else ""
        if isinstance(payload, dict):
            parts = [payload.get("message"), payload.get("error")]
            text = "; ".join(str(p) for p in parts if p and isinstance(p, str | int | float))
            if not text and payload.get("errors"):
                text = json.dumps(payload["errors"])[:200]
            return f" ({self.scrub(text)[:200]})" if text else ""
        return ""

    def fail(self, message: str, *, stop: bool = False) -> None:
        self.error_count += 1
        errors = self.report.errors
        if len(errors) < MAX_ERRORS:
            errors.append(self.scrub(message))
        elif len(errors) == MAX_ERRORS:
            errors.append("further errors left out")
        if stop and not self.stopped:
            self.stopped = True
            errors.append("export stopped: no further requests sent")

    def scrub(self, text: str) -> str:
        for secret in (self.target.secret_key, self.target.public_key):
            if secret:
                text = text.replace(secret, "***")
        return text


# --- helpers ----------------------------------------------------------------------------------------
def _secret(value: Any) -> str:
    if value is None:
        return ""
    raw = value.get_secret_value() if hasattr(value, "get_secret_value") else str(value)
    return raw.strip()


_UNSAFE_NAME = re.compile(r"[/<>\s]+")


def _name_part(value: str) -> str:
    """One part of a dataset name: no slash (that would make a folder), no angle brackets (Langfuse
    refuses anything that looks like an HTML tag), no whitespace."""
    return _UNSAFE_NAME.sub("_", value.strip()).strip("_") or "_"


def _where(host: str) -> str:
    """The host without any userinfo (a URL may carry credentials)."""
    parts = urlsplit(host)
    return f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "") if parts.hostname else host


def _iso(moment: datetime) -> str:
    """ISO 8601 with an offset, which Langfuse requires of event timestamps; naive times are UTC."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _json_safe(value: Any) -> Any:
    """JSON-encodable: NaN and infinities become null (JSON has no such numbers), other objects text."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, str | int | bool):
        return value
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_json_safe(v) for v in value]
    if isinstance(value, datetime):
        return _iso(value)
    return str(value)


def _dumps(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def _batches(events: list[tuple[dict[str, Any], bytes]], size: int,
             max_bytes: int) -> Iterable[list[tuple[dict[str, Any], bytes]]]:
    batch: list[tuple[dict[str, Any], bytes]] = []
    used = 0
    for event in events:
        length = len(event[1]) + 1
        if batch and (len(batch) >= size or used + length > max_bytes):
            yield batch
            batch, used = [], 0
        batch.append(event)
        used += length
    if batch:
        yield batch
