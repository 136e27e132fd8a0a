"""Tenants as the tables hold them: which exist, and deleting everything of one.

A tenant exists while a key or a collection names it (there is no tenants table to fall out of
step with them). Its data is found by the tenant in each collection key (``ragsvc_tenant_of``).
"""

from __future__ import annotations

from sqlalchemy import text

from rag_service.db.engine import Database
from rag_service.errors import ConflictError

# Deleted in this order, in one transaction. Queries first: answers, turns, scores, feedback and
# review items (with their decisions) go with them by cascade. Collections take their documents and
# chunks, and the chunks' triggers their keyword postings; the per-collection BM25 totals have no
# foreign key, so they are deleted by collection id before the collections.
_BY_COLLECTION_KEY = ("queries", "review_items", "golden_items", "conversations", "query_traces", "eval_runs",
                      "ingest_jobs")


class TenantRepository:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def list(self) -> list[dict[str, object]]:
        """Every tenant with its active keys, collections and documents."""
        async with self._db.connect() as conn:
            rows = await conn.execute(text(
                "SELECT t.tenant, "
                "(SELECT count(*) FROM api_keys k WHERE k.tenant = t.tenant AND k.revoked_at IS NULL) AS keys, "
                "(SELECT count(*) FROM collections c WHERE c.tenant = t.tenant) AS collections, "
                "(SELECT count(*) FROM documents d JOIN collections c ON c.id = d.collection_id "
                " WHERE c.tenant = t.tenant) AS documents "
                "FROM (SELECT tenant FROM api_keys UNION SELECT tenant FROM collections) t ORDER BY t.tenant"))
            return [dict(r._mapping) for r in rows]

    async def revoke_keys(self, tenant: str) -> int:
        """Revoke the tenant's keys (the first step of deleting it: servers stop accepting them
        within their key cache's lifetime, so no request writes for the tenant while it is deleted)."""
        async with self._db.begin() as conn:
            result = await conn.execute(text(
                "UPDATE api_keys SET revoked_at = now() WHERE tenant = :t AND revoked_at IS NULL"), {"t": tenant})
        return result.rowcount or 0

    async def delete(self, tenant: str) -> dict[str, int]:
        """Delete every row of the tenant (its keys included), in one transaction: rows deleted per
        table. Refused while one of its ingestion jobs or eval runs is running: the worker would go
        on writing, and recreate the collection it writes to."""
        deleted: dict[str, int] = {}
        async with self._db.begin() as conn:
            running = (await conn.execute(text(
                "SELECT (SELECT count(*) FROM ingest_jobs WHERE status = 'running' "
                "AND ragsvc_tenant_of(collection) = :t) + (SELECT count(*) FROM eval_runs "
                "WHERE status = 'running' AND ragsvc_tenant_of(collection) = :t)"),
                {"t": tenant})).scalar_one()
            if running:
                raise ConflictError(f"{running} ingestion job(s) or eval run(s) of tenant {tenant!r} are running; "
                                    "wait for them to end (`GET /v1/jobs`, `ragsvc eval list`), then delete again")
            # Their queued tasks: a worker would find the job or run gone.
            await conn.execute(text(
                "DELETE FROM procrastinate_jobs WHERE status = 'todo' AND ("
                "args->>'job_id' IN (SELECT id::text FROM ingest_jobs WHERE ragsvc_tenant_of(collection) = :t) OR "
                "args->>'run_id' IN (SELECT id::text FROM eval_runs WHERE ragsvc_tenant_of(collection) = :t))"),
                {"t": tenant})
            for table in _BY_COLLECTION_KEY:
                result = await conn.execute(text(f"DELETE FROM {table} WHERE ragsvc_tenant_of(collection) = :t"),
                                            {"t": tenant})
                deleted[table] = result.rowcount or 0
            deleted["documents"] = int((await conn.execute(text(
                "SELECT count(*) FROM documents d JOIN collections c ON c.id = d.collection_id WHERE c.tenant = :t"),
                {"t": tenant})).scalar_one())
            ids = list((await conn.execute(text("SELECT id FROM collections WHERE tenant = :t"),
                                           {"t": tenant})).scalars())
            deleted["collections"] = (await conn.execute(text("DELETE FROM collections WHERE tenant = :t"),
                                                         {"t": tenant})).rowcount or 0
            # After the collections: deleting their chunks appends keyword statistics deltas.
            await conn.execute(text("DELETE FROM keyword_stats WHERE collection_id = ANY(:ids)"), {"ids": ids})
            deleted["api_keys"] = (await conn.execute(text("DELETE FROM api_keys WHERE tenant = :t"),
                                                      {"t": tenant})).rowcount or 0
        return deleted
