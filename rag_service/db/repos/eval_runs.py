"""Offline evaluation runs and their per-item results.

A result row is written the moment its item finishes (one small transaction each), so a run that
dies keeps everything it finished; ``done`` tells the resumed run what to skip. The primary key
(run, item, repetition) makes a result that is written twice (two workers racing on a resumed run)
land once.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import JSONB

from rag_service.db.engine import Database
from rag_service.db.tenancy import in_scope_sql
from rag_service.db.values import strip_nul
from rag_service.domain import DatasetRef, EvalItemResult, EvalRun, EvalRunRequest, ScoreRow, TenantScope
from rag_service.errors import ConflictError, NotFoundError

ALIVE_S = 60  # a running run quiet for longer is taken to be interrupted (its process died)
_COLUMNS = ("r.id, r.name, r.status, r.dataset, r.mode, r.collection, r.request, r.config, r.config_hash, "
            "r.code_version, r.seed, r.items_total, r.summary, r.error, r.created_at, r.started_at, r.finished_at, "
            "(SELECT count(*) FROM eval_results e WHERE e.run_id = r.id) AS items_done, "
            "(SELECT count(*) FROM eval_results e WHERE e.run_id = r.id AND e.failed) AS items_failed")


def _run(row: Any) -> EvalRun:
    values = dict(row._mapping)
    values["dataset"] = DatasetRef.model_validate(values["dataset"])
    values["request"] = EvalRunRequest.model_validate(values["request"])
    return EvalRun.model_validate(values)


class EvalRunRepository:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def create(self, *, name: str | None, dataset: DatasetRef, request: EvalRunRequest, collection: str,
                     config: dict[str, Any], config_hash: str, code_version: str | None, items_total: int,
                     created_by: str | None = None) -> EvalRun:
        run_id = uuid.uuid4()
        async with self._db.begin() as conn:
            await conn.execute(text(
                "INSERT INTO eval_runs (id, name, dataset, dataset_version, mode, collection, request, config, "
                "config_hash, code_version, seed, items_total, created_by) VALUES (:id, :name, :dataset, "
                ":dataset_version, :mode, :collection, :request, :config, :config_hash, :code_version, :seed, "
                ":items_total, :created_by)").bindparams(
                    bindparam("dataset", type_=JSONB), bindparam("request", type_=JSONB),
                    bindparam("config", type_=JSONB)),
                {"id": run_id, "name": name, "dataset": dataset.model_dump(mode="json"),
                 "dataset_version": dataset.version, "mode": request.mode, "collection": collection,
                 "request": request.model_dump(mode="json"), "config": strip_nul(config), "config_hash": config_hash,
                 "code_version": code_version, "seed": request.seed, "items_total": items_total,
                 "created_by": created_by})
        return await self.get(run_id)

    async def get(self, run_id: uuid.UUID, scope: TenantScope | None = None) -> EvalRun:
        """The run, if its collection is in ``scope`` (None: any tenant's)."""
        params: dict[str, Any] = {"id": run_id}
        visible = in_scope_sql("r.collection", scope, params)
        async with self._db.connect() as conn:
            row = (await conn.execute(text(f"SELECT {_COLUMNS} FROM eval_runs r WHERE r.id = :id AND {visible}"),
                                      params)).first()
        if row is None:
            raise NotFoundError(f"no eval run {run_id}")
        return _run(row)

    async def find(self, reference: str, scope: TenantScope | None = None) -> EvalRun:
        """A run by id, or the newest run with that name (in ``scope``; None: any tenant's)."""
        try:
            return await self.get(uuid.UUID(reference), scope)
        except ValueError:
            pass
        params: dict[str, Any] = {"name": reference}
        visible = in_scope_sql("r.collection", scope, params)
        async with self._db.connect() as conn:
            row = (await conn.execute(text(
                f"SELECT {_COLUMNS} FROM eval_runs r WHERE r.name = :name AND {visible} "
                "ORDER BY r.created_at DESC LIMIT 1"), params)).first()
        if row is None:
            raise NotFoundError(f"no eval run with id or name {reference!r}; `ragsvc eval list` shows them")
        return _run(row)

    async def list(self, *, limit: int = 50, offset: int = 0,
                   scope: TenantScope | None = None) -> tuple[list[EvalRun], int]:
        """Runs newest first, of collections in ``scope`` (None: every tenant's)."""
        params: dict[str, Any] = {"limit": limit, "offset": offset}
        visible = in_scope_sql("r.collection", scope, params)
        async with self._db.connect() as conn:
            rows = (await conn.execute(text(
                f"SELECT {_COLUMNS} FROM eval_runs r WHERE {visible} ORDER BY r.created_at DESC "
                "LIMIT :limit OFFSET :offset"), params)).all()
            total = (await conn.execute(text(f"SELECT count(*) FROM eval_runs r WHERE {visible}"), params)).scalar_one()
        return [_run(r) for r in rows], total

    async def start(self, run_id: uuid.UUID, *, force: bool = False, redo_failed: bool = False) -> EvalRun:
        """Mark the run running (again, when resumed). A finished run runs again only with
        ``redo_failed`` and only for its failed items (every other result stays). A run that reported
        progress in the last ``ALIVE_S`` seconds is someone else's to finish unless ``force`` (two
        processes on one run waste work but store each result once)."""
        async with self._db.begin() as conn:
            row = (await conn.execute(text(
                "SELECT status, extract(epoch FROM now() - heartbeat_at) AS quiet_s, (SELECT count(*) FROM "
                "eval_results e WHERE e.run_id = r.id AND e.failed) AS failed FROM eval_runs r WHERE id = :id "
                "FOR UPDATE"), {"id": run_id})).first()
            if row is None:
                raise NotFoundError(f"no eval run {run_id}")
            if row.status == "finished" and not (row.failed and redo_failed):
                raise ConflictError(f"eval run {run_id} has finished with {row.failed} failed items; "
                                    + ("resume it to run those again" if row.failed else "start a new run instead"))
            if row.status == "running" and row.quiet_s is not None and row.quiet_s < ALIVE_S and not force:
                raise ConflictError(f"eval run {run_id} is running elsewhere (progress {float(row.quiet_s):.0f} s "
                                    "ago); wait for it, or resume with force if that process is gone")
            await conn.execute(text(
                "UPDATE eval_runs SET status = 'running', error = NULL, finished_at = NULL, "
                "started_at = coalesce(started_at, now()), heartbeat_at = now() WHERE id = :id"), {"id": run_id})
        return await self.get(run_id)

    async def heartbeat(self, run_id: uuid.UUID) -> None:
        async with self._db.begin() as conn:
            await conn.execute(text("UPDATE eval_runs SET heartbeat_at = now() WHERE id = :id"), {"id": run_id})

    async def done(self, run_id: uuid.UUID) -> set[tuple[str, int]]:
        """(item id, repetition) of every result stored without an error (failed items are tried again)."""
        async with self._db.connect() as conn:
            rows = (await conn.execute(text(
                "SELECT item_id, repetition FROM eval_results WHERE run_id = :id AND NOT failed"),
                                       {"id": run_id})).all()
        return {(r.item_id, r.repetition) for r in rows}

    async def record(self, run_id: uuid.UUID, position: int, result: EvalItemResult) -> None:
        payload = strip_nul(json.loads(result.model_dump_json()))
        async with self._db.begin() as conn:
            await conn.execute(text(
                "INSERT INTO eval_results (run_id, item_id, repetition, position, result, failed) VALUES "
                "(:run_id, :item_id, :repetition, :position, :result, :failed) ON CONFLICT (run_id, item_id, "
                "repetition) DO UPDATE SET result = EXCLUDED.result, failed = EXCLUDED.failed, finished_at = now() "
                "WHERE eval_results.failed").bindparams(
                    bindparam("result", type_=JSONB)),
                {"run_id": run_id, "item_id": result.item_id, "repetition": result.repetition, "position": position,
                 "result": payload, "failed": result.error is not None})
            await conn.execute(text("UPDATE eval_runs SET heartbeat_at = now() WHERE id = :id"), {"id": run_id})

    async def results(self, run_id: uuid.UUID, *, limit: int | None = None, offset: int = 0) -> list[EvalItemResult]:
        """In dataset order (then repetition); all of them unless ``limit``."""
        async with self._db.connect() as conn:
            rows = (await conn.execute(text(
                "SELECT result FROM eval_results WHERE run_id = :id ORDER BY position, repetition "
                "LIMIT :limit OFFSET :offset"), {"id": run_id, "limit": limit, "offset": offset})).all()
        return [EvalItemResult.model_validate(r.result) for r in rows]

    async def scores(self, run_id: uuid.UUID) -> list[ScoreRow]:
        """Every result's numbers (metrics, total latency, cost, failed), in dataset order: what a
        comparison reads. A retrieval run's results carry 100 ranked documents each; loading and
        validating whole results dominated comparing large runs (8.8 s for two of 10,000 items)."""
        async with self._db.connect() as conn:
            rows = (await conn.execute(text(
                "SELECT item_id, result->'metrics' AS metrics, (result->'latency_ms'->>'total')::float8 AS latency, "
                "(result->>'cost_usd')::float8 AS cost, failed FROM eval_results WHERE run_id = :id "
                "ORDER BY position, repetition"), {"id": run_id})).all()
        return [ScoreRow(r.item_id, r.metrics or {}, r.latency, r.cost, r.failed) for r in rows]

    async def finish(self, run_id: uuid.UUID, *, summary: dict[str, Any], error: str | None = None) -> EvalRun:
        async with self._db.begin() as conn:
            await conn.execute(text(
                "UPDATE eval_runs SET status = :status, summary = :summary, error = :error, finished_at = now() "
                "WHERE id = :id").bindparams(bindparam("summary", type_=JSONB)),
                {"id": run_id, "status": "failed" if error else "finished", "summary": summary, "error": error})
        return await self.get(run_id)

    async def golden_rows(self, tenant: str | None = None) -> list[dict[str, Any]]:
        """Golden items (reviewed answers), those of one tenant's collections (None: every tenant's)."""
        condition = "TRUE" if tenant is None else "ragsvc_tenant_of(collection) = :tenant"
        async with self._db.connect() as conn:
            rows = (await conn.execute(text(
                "SELECT id, collection, question, answer, citations, source FROM golden_items "
                f"WHERE {condition} ORDER BY id"), {"tenant": tenant})).all()
        return [dict(r._mapping) for r in rows]

    async def baselines(self, dataset_version: str, mode: str, exclude: Sequence[uuid.UUID] = ()) -> list[EvalRun]:
        """Finished runs on the same data and mode, newest first (candidates for a comparison baseline)."""
        async with self._db.connect() as conn:
            rows = (await conn.execute(text(
                f"SELECT {_COLUMNS} FROM eval_runs r WHERE r.dataset_version = :version AND r.mode = :mode "
                "AND r.status = 'finished' AND NOT (r.id = ANY(:exclude)) ORDER BY r.finished_at DESC LIMIT 50"),
                {"version": dataset_version, "mode": mode, "exclude": list(exclude)})).all()
        return [_run(r) for r in rows]
