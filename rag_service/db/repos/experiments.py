"""Experiments between two labels of a prompt, and their observations: each answer given under
the experiment with its variant, grades, review outcome and latency (``rag_service.learning``
turns them into statistics)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text

from rag_service.db.engine import Database
from rag_service.db.repos.prompts import _EXPERIMENT, notify
from rag_service.domain.prompts import Experiment, ExperimentRequest
from rag_service.errors import ConflictError, NotFoundError


@dataclass(frozen=True)
class Observation:
    """One answer of an experiment, in arrival order."""

    variant: str
    unit: str  # what the assignment stuck to: one cluster of answers
    overall: float | None
    metrics: dict[str, float]
    answered: bool  # False: the answer said the documents do not answer
    queued: bool  # the answer went to the review queue
    decision: str | None  # approved | rejected | edited, once reviewed
    latency_ms: float | None
    generator: str
    llm_tokens: dict[str, int] | None = None  # None: no LLM, or the server reported none


def _experiment(row: Any) -> Experiment:
    return Experiment.model_validate(dict(row._mapping))


class ExperimentRepository:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def start(self, request: ExperimentRequest, control_version: int, candidate_version: int,
                    started_by: str | None) -> Experiment:
        async with self._db.begin() as conn:
            running = (await conn.execute(text(
                "SELECT id FROM experiments WHERE name = :name AND status = 'running' FOR UPDATE"),
                {"name": request.name})).first()
            if running is not None:
                raise ConflictError(f"prompt {request.name!r} already has a running experiment ({running.id}); "
                                    "stop it first", fields={"experiment_id": str(running.id)})
            row = (await conn.execute(text(
                "INSERT INTO experiments (id, name, control_label, candidate_label, control_version, "
                "candidate_version, share, alpha, tau, started_by, note) VALUES (:id, :name, :control_label, "
                ":candidate_label, :control_version, :candidate_version, :share, :alpha, :tau, :started_by, :note) "
                f"RETURNING {_EXPERIMENT}"),
                {"id": uuid.uuid4(), **request.model_dump(exclude={"note"}), "note": request.note,
                 "control_version": control_version, "candidate_version": candidate_version,
                 "started_by": started_by})).one()
            await notify(conn, "prompt", request.name)
        return _experiment(row)

    async def end(self, experiment_id: uuid.UUID, status: str, reason: str, *, running_only: bool = True
                  ) -> Experiment:
        """End an experiment (``stopped`` by the guardrail or a person, ``promoted``, ``ended``);
        traffic goes back to the control label at once. ``running_only``: a 409 unless it is still
        running; otherwise (promoting after a stop) the outcome and its reason are added to what is
        recorded."""
        guard = "AND status = 'running'" if running_only else ""
        async with self._db.begin() as conn:
            row = (await conn.execute(text(
                "UPDATE experiments SET status = :status, stop_reason = COALESCE(stop_reason || '; ', '') || :reason, "
                f"ended_at = COALESCE(ended_at, now()) WHERE id = :id {guard} RETURNING {_EXPERIMENT}"),
                {"id": experiment_id, "status": status, "reason": reason})).first()
            if row is None:
                await self.get(experiment_id)  # NotFoundError when it does not exist
                raise ConflictError(f"experiment {experiment_id} is not running",
                                    fields={"experiment_id": str(experiment_id)})
            await notify(conn, "prompt", row.name)
        return _experiment(row)

    async def running(self) -> list[Experiment]:
        async with self._db.connect() as conn:
            rows = (await conn.execute(text(
                f"SELECT {_EXPERIMENT} FROM experiments WHERE status = 'running' ORDER BY created_at"))).all()
        return [_experiment(r) for r in rows]

    async def get(self, experiment_id: uuid.UUID) -> Experiment:
        async with self._db.connect() as conn:
            row = (await conn.execute(text(f"SELECT {_EXPERIMENT} FROM experiments WHERE id = :id"),
                                      {"id": experiment_id})).first()
        if row is None:
            raise NotFoundError(f"no experiment {experiment_id}")
        return _experiment(row)

    async def list(self, name: str | None = None, *, limit: int = 50, offset: int = 0
                   ) -> tuple[list[Experiment], int]:
        params = {"name": name, "limit": limit, "offset": offset}
        where = "(CAST(:name AS text) IS NULL OR name = :name)"
        async with self._db.connect() as conn:
            rows = (await conn.execute(text(
                f"SELECT {_EXPERIMENT} FROM experiments WHERE {where} ORDER BY created_at DESC "
                "LIMIT :limit OFFSET :offset"), params)).all()
            total = (await conn.execute(text(f"SELECT count(*) FROM experiments WHERE {where}"), params)).scalar_one()
        return [_experiment(r) for r in rows], total

    async def observations(self, experiment_id: uuid.UUID) -> list[Observation]:
        """Every answer given under the experiment, oldest first. The grades are the combined
        scorer's where the LLM judge has graded, else the local scorer's."""
        async with self._db.connect() as conn:
            rows = (await conn.execute(text(
                "SELECT a.variant, COALESCE(a.experiment_unit, CAST(a.id AS text)) AS unit, s.overall, s.metrics, "
                "(r.id IS NOT NULL) AS queued, d.decision, (q.outcome <> 'no_answer') AS answered, "
                "CAST(a.timings_ms ->> 'total' AS float8) AS latency_ms, a.generator, a.llm_tokens FROM answers a "
                "LEFT JOIN LATERAL (SELECT overall, metrics FROM answer_scores WHERE query_id = a.query_id "
                "ORDER BY (scorer = 'combined') DESC, id DESC LIMIT 1) s ON TRUE "
                "JOIN queries q ON q.id = a.query_id LEFT JOIN review_items r ON r.query_id = a.query_id "
                "LEFT JOIN review_decisions d ON d.review_id = r.id "
                "WHERE a.experiment_id = :id ORDER BY a.created_at, a.id"), {"id": experiment_id})).all()
        return [Observation(
            variant=r.variant, unit=r.unit, overall=r.overall, answered=r.answered, queued=r.queued,
            decision=r.decision, latency_ms=r.latency_ms, generator=r.generator, llm_tokens=r.llm_tokens,
            metrics={k: float(v["value"]) for k, v in (r.metrics or {}).items()
                     if isinstance(v, dict) and v.get("value") is not None})
            for r in rows]
