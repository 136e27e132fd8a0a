"""Stored query traces: written when a query finishes, read by id, deleted by age."""

from __future__ import annotations

import json
import uuid

from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import JSONB

from rag_service.db.engine import Database
from rag_service.db.values import strip_nul
from rag_service.domain import EvaluationReport, QueryTrace
from rag_service.errors import NotFoundError

# A trace is written after its answer has gone and is best effort (a write that fails is logged and
# the answer stands), so its commit does not wait for the WAL to reach the disk. PostgreSQL's WAL
# writer flushes it within three times wal_writer_delay (about 600 ms by default); a crash of the
# server or the machine in that window can lose those traces, never corrupt anything. Waiting for
# the flush made the next query wait for the disk too (docs/benchmarks.md, "Cost of metrics, logs
# and traces"). The query log, which answers and the review queue depend on, keeps waiting for it.
NO_FLUSH_WAIT = text("SET LOCAL synchronous_commit = off")


class TraceRepository:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def record_trace(self, trace: QueryTrace) -> None:
        async with self._db.begin() as conn:
            await conn.execute(NO_FLUSH_WAIT)
            await conn.execute(text(
                "INSERT INTO query_traces (query_id, collection, api_key_id, trace) VALUES (:id, :collection, "
                ":key, :trace) ON CONFLICT (query_id) DO NOTHING").bindparams(bindparam("trace", type_=JSONB)),
                {"id": trace.query_id, "collection": trace.collection, "key": trace.api_key_id,
                 "trace": strip_nul({**json.loads(trace.model_dump_json()), "principals": trace.principals})})

    async def record_evaluation(self, query_id: uuid.UUID, report: EvaluationReport) -> None:
        """The late LLM grades replace the delivered ones (a no-op when the trace is gone or not yet written)."""
        async with self._db.begin() as conn:
            await conn.execute(NO_FLUSH_WAIT)
            await conn.execute(text(
                "UPDATE query_traces SET trace = jsonb_set(trace, '{evaluation}', :report) WHERE query_id = :id"
            ).bindparams(bindparam("report", type_=JSONB)),
                {"id": query_id, "report": strip_nul(json.loads(report.model_dump_json()))})

    async def get(self, query_id: uuid.UUID) -> QueryTrace:
        async with self._db.connect() as conn:
            row = (await conn.execute(text(
                "SELECT trace, collection, api_key_id, created_at FROM query_traces WHERE query_id = :id"),
                {"id": query_id})).first()
        if row is None:
            raise NotFoundError(f"no trace of query {query_id} (traces are kept for RAGSVC_TRACE_RETENTION_DAYS)")
        # The collection's key from its column: the JSON holds the bare name a response shows.
        return QueryTrace.model_validate({**row.trace, "collection": row.collection, "api_key_id": row.api_key_id,
                                          "created_at": row.created_at})

    async def delete_older_than(self, days: float) -> int:
        async with self._db.begin() as conn:
            result = await conn.execute(text(
                "DELETE FROM query_traces WHERE created_at < now() - make_interval(secs => :seconds)"),
                {"seconds": days * 86400})
        return result.rowcount or 0
