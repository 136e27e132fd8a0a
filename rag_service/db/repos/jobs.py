"""Ingestion jobs: the request, progress, outcome, and the uploads a job ingests."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import delete, func, insert, select, update

from rag_service.db.engine import Database
from rag_service.db.models import IngestJob, IngestUpload
from rag_service.db.tenancy import in_scope
from rag_service.db.values import strip_nul
from rag_service.domain import JobView, TenantScope, Upload
from rag_service.errors import NotFoundError, RagServiceError

log = logging.getLogger(__name__)


class JobRepository:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def create(self, collection: str, params: dict[str, Any], uploads: Sequence[Upload] = ()) -> uuid.UUID:
        job_id = uuid.uuid4()
        async with self._db.begin() as conn:
            await conn.execute(insert(IngestJob).values(
                id=job_id, collection=collection, status="queued", params=params, progress={}, attempts=0))
            if uploads:
                await conn.execute(insert(IngestUpload), [
                    {"job_id": job_id, "source_uri": strip_nul(u.source_uri), "filename": strip_nul(u.filename),
                     "content": u.content, "title": strip_nul(u.title), "metadata": strip_nul(u.metadata or {})}
                    for u in uploads
                ])
        return job_id

    async def discard(self, job_id: uuid.UUID, cause: Exception) -> Exception:
        """Forget a job that could not be queued, uploads included: its caller is told it failed
        (the error returned, ``cause`` as a service error), so nothing of it may stay behind."""
        try:
            async with self._db.begin() as conn:
                await conn.execute(delete(IngestJob).where(IngestJob.id == job_id))  # uploads: ON DELETE CASCADE
        except RagServiceError as exc:
            log.error("ingestion job %s could not be queued, nor removed: %s", job_id, exc)
        return self._db.translate(cause)

    async def count_queued(self) -> int:
        """Jobs waiting for a worker, across every replica (the ingestion queue's depth)."""
        async with self._db.connect() as conn:
            return int((await conn.execute(
                select(func.count()).select_from(IngestJob).where(IngestJob.status == "queued"))).scalar_one())

    async def get(self, job_id: uuid.UUID) -> JobView:
        async with self._db.connect() as conn:
            row = (await conn.execute(select(IngestJob.__table__).where(IngestJob.id == job_id))).first()
        if row is None:
            raise NotFoundError(f"no ingestion job {job_id}")
        return JobView.model_validate(dict(row._mapping))

    async def list(self, *, limit: int = 50, offset: int = 0,
                   scope: TenantScope | None = None) -> tuple[list[JobView], int]:
        """Jobs newest first, those of collections in ``scope`` (None: every tenant's)."""
        visible = in_scope(IngestJob.collection, scope)
        async with self._db.connect() as conn:
            rows = (await conn.execute(
                select(IngestJob.__table__).where(visible).order_by(IngestJob.created_at.desc())
                .limit(limit).offset(offset)
            )).all()
            total = (await conn.execute(select(func.count()).select_from(IngestJob).where(visible))).scalar_one()
        return [JobView.model_validate(dict(r._mapping)) for r in rows], total

    async def uploads(self, job_id: uuid.UUID) -> list[Upload]:
        async with self._db.connect() as conn:
            rows = (await conn.execute(
                select(IngestUpload.source_uri, IngestUpload.filename, IngestUpload.content, IngestUpload.title,
                       IngestUpload.metadata_.label("metadata")).where(IngestUpload.job_id == job_id)
                .order_by(IngestUpload.id)
            )).all()
        return [Upload(r.source_uri, r.filename, bytes(r.content), r.title, r.metadata) for r in rows]

    async def _update(self, job_id: uuid.UUID, **values: Any) -> None:
        async with self._db.begin() as conn:
            await conn.execute(update(IngestJob).where(IngestJob.id == job_id).values(**values))

    async def mark_running(self, job_id: uuid.UUID) -> None:
        await self._update(job_id, status="running", started_at=func.now(), attempts=IngestJob.attempts + 1,
                           error=None)

    async def set_progress(self, job_id: uuid.UUID, progress: dict[str, Any]) -> None:
        await self._update(job_id, progress=progress)

    async def finish(self, job_id: uuid.UUID, report: dict[str, Any] | None, error: str | None) -> None:
        async with self._db.begin() as conn:
            await conn.execute(update(IngestJob).where(IngestJob.id == job_id).values(
                status="failed" if error else "succeeded", report=report, error=error, finished_at=func.now()))
            if error is None:
                # Uploaded bytes are only needed until the job has succeeded.
                await conn.execute(delete(IngestUpload).where(IngestUpload.job_id == job_id))
