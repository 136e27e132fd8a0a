"""What ``/metrics`` reads from the database when scraped: the queues every replica and worker share."""

from __future__ import annotations

from typing import get_args

from sqlalchemy import text

from rag_service.db.engine import Database
from rag_service.domain import REVIEW_STATUSES
from rag_service.domain.jobs import JobStatus
from rag_service.domain.monitoring import QueueFigures

JOB_STATUSES: tuple[str, ...] = get_args(JobStatus)


class MonitoringRepository:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def queue_figures(self) -> QueueFigures:
        async with self._db.connect() as conn:
            jobs = {r.status: r.n for r in (await conn.execute(text(
                "SELECT status, count(*) AS n FROM ingest_jobs GROUP BY status"))).all()}
            reviews = {r.status: r.n for r in (await conn.execute(text(
                "SELECT status, count(*) AS n FROM review_items GROUP BY status"))).all()}
            ages = (await conn.execute(text(
                "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM now() - created_at)) AS p50, "
                "percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM now() - created_at)) AS p95 "
                "FROM review_items WHERE status IN ('pending', 'claimed')"))).one()
        # Every status is reported, 0 when none: a series that disappears reads as "no data", not 0.
        return QueueFigures(jobs_by_status={s: int(jobs.get(s, 0)) for s in sorted({*JOB_STATUSES, *jobs})},
                            reviews_by_status={s: int(reviews.get(s, 0)) for s in sorted({*REVIEW_STATUSES, *reviews})},
                            open_review_age_s={"p50": _seconds(ages.p50), "p95": _seconds(ages.p95)})


def _seconds(value: object) -> float | None:
    return None if value is None else max(0.0, float(value))  # type: ignore[arg-type]
