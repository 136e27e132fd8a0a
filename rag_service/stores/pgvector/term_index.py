"""A tantivy index beside PostgreSQL, so a BM25 top k need not read whole posting lists.

Why: BM25 in SQL scores every posting of every query term, and a common term's list grows with
the collection (149 ms p95 at 100,000 chunks; docs/scaling.md). tantivy stores postings in blocks
with each block's best score and skips the blocks that cannot reach the current k-th score
(block-max WAND), so a common term costs little.

What it holds: one index directory per collection, one document per searchable chunk, whose tokens
are the chunk's lexemes exactly as PostgreSQL's text search configuration made them (each repeated
as often as it occurs), so terms, frequencies and lengths are PostgreSQL's own. PostgreSQL stays
the source of truth: an index is built from ``chunks`` when missing or stale, and follows the
``keyword_changes`` log (migration 0013): before each search it applies the chunks written by
transactions at or above its last snapshot's xmin that it has not applied yet.

Its scores are candidates, not answers: tantivy keeps a chunk's length in one byte (rounded down),
so its BM25 is an upper bound of the exact one. ``bm25.py`` rescores the candidates exactly and
proves that nothing outside them can do better, or asks for more.

Only the process that applies changes writes (tantivy's writer lock); a process that cannot get
the lock, or whose index is still being built, answers with the SQL scoring instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import tantivy
from sqlalchemy import text

from rag_service.db.engine import Database

log = logging.getLogger(__name__)

FORMAT = 2  # 2: the chunk id in two u64 fast fields (read without fetching stored documents)
STALE_AFTER_S = 12 * 3600  # keyword_changes keeps a day (the server's hourly cleanup): rebuild well before
_BATCH = 5000
_WRITER_HEAP = 64_000_000
# A chunk's lexemes, each repeated tf times (tf counted as the postings trigger counts it).
_LEXEMES = ("(SELECT coalesce(string_agg(repeat(u.lexeme || ' ', coalesce(array_length(u.positions, 1), 1)), ''), '') "
            "FROM unnest(c.tsv) u)")

_LOW_64 = (1 << 64) - 1
_SNAPSHOT = text("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint, extract(epoch FROM now())")


def _schema() -> tantivy.Schema:
    builder = tantivy.SchemaBuilder()
    # Whitespace only: the tokens are already PostgreSQL's lexemes. Frequencies, no positions.
    builder.add_text_field("terms", tokenizer_name="whitespace", index_option="freq", stored=False)
    # The chunk id as one untokenised term, so a changed chunk can be deleted by it, and as two
    # 64-bit halves in column storage, read for a whole hit list at once.
    builder.add_text_field("chunk", tokenizer_name="raw", index_option="basic")
    builder.add_unsigned_field("chunk_hi", fast=True)
    builder.add_unsigned_field("chunk_lo", fast=True)
    return builder.build()


SCHEMA = _schema()


@dataclass
class _Collection:
    """One collection's open index and what it has applied of the change log."""

    path: Path
    index: tantivy.Index
    applied_xmin: int            # every transaction below this had finished when last applied
    checked_at: float            # database time of the last check that found the index current
    seen: dict[int, int] = field(default_factory=dict)  # change rows (seq: xid) at or above it, applied
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    written_at: float = 0.0


@dataclass(frozen=True)
class Candidates:
    """tantivy's best ``depth`` chunks for a query, with its (upper-bound) scores."""

    chunk_ids: list[uuid.UUID]
    scores: list[float]
    doc_freqs: dict[str, int]
    total_docs: float   # N and average length as tantivy scored them (deleted chunks count until merged)
    avgdl: float


class TermIndex:
    """The per-collection tantivy indexes under ``root`` for one database."""

    def __init__(self, db: Database, root: Path, *, build_in_background: bool = True, min_chunks: int = 0) -> None:
        self._db = db
        self._root = root
        # Smaller collections are scored in SQL (fast at that size): no index to build or keep.
        self.min_chunks = min_chunks
        # A server answers from SQL while an index builds; tests and benchmarks wait for it.
        self._background = build_in_background
        self.answered = 0   # searches answered from the index (proven top k)
        self.fell_back = 0  # searches the SQL scoring answered (not ready, or no proof within MAX_DEPTH)
        self._open: dict[int, _Collection] = {}
        self._building: dict[int, asyncio.Task[None]] = {}
        self._database_dir: Path | None = None

    async def _dir(self, collection_id: int) -> Path:
        if self._database_dir is None:
            # One directory per database: a data dir pointed at another server must not reuse an index.
            async with self._db.connect() as conn:
                ident = (await conn.execute(text(
                    "SELECT system_identifier::text || '-' || current_database() FROM pg_control_system()"
                ))).scalar_one()
            self._database_dir = self._root / ident
        return self._database_dir / str(collection_id)

    async def current(self, collection_id: int, *, wait: bool = False) -> _Collection | None:
        """The collection's index with every committed change applied, or None while it is being
        built (``wait`` builds it now) or when this process cannot write to it."""
        entry = self._open.get(collection_id) or await self._load(collection_id)
        if entry is None:
            task = self._building.get(collection_id)
            if task is None:
                task = asyncio.create_task(self._build(collection_id))
                self._building[collection_id] = task
                task.add_done_callback(lambda _t: self._building.pop(collection_id, None))
            if not wait and self._background:
                return None
            await asyncio.shield(task)
            entry = self._open.get(collection_id)
            if entry is None:
                return None
        try:
            fresh = await self._catch_up(collection_id, entry)
        except (OSError, ValueError) as exc:  # another process holds the writer, or the disk failed
            log.warning("keyword index of collection %s not updated (%s): answering from SQL", collection_id, exc)
            return None
        return entry if fresh else None

    async def ready(self, collection_id: int) -> bool:
        """Build (or catch up) the collection's index now; True when searches will use it."""
        return await self.current(collection_id, wait=True) is not None

    def candidates(self, entry: _Collection, terms: list[str], depth: int) -> Candidates:
        searcher = entry.index.searcher()
        query = tantivy.Query.boolean_query(
            [(tantivy.Occur.Should, tantivy.Query.term_query(SCHEMA, "terms", t)) for t in terms])
        # count=False: counting every match would visit every posting, which is what this avoids.
        hits = searcher.search(query, depth, count=False).hits
        doc_freqs = {t: searcher.doc_freq("terms", t) for t in terms}
        total, avgdl = float(searcher.num_docs), 0.0
        if hits:
            total, avgdl = _statistics(query.explain(searcher, hits[0][1]).to_json())
        addresses = [address for _, address in hits]
        ids = [uuid.UUID(int=hi << 64 | lo) for hi, lo in zip(searcher.fast_field_values("chunk_hi", addresses),
                                                            searcher.fast_field_values("chunk_lo", addresses),
                                                            strict=True)]
        return Candidates(ids, [score for score, _ in hits], doc_freqs, total, avgdl)

    async def _load(self, collection_id: int) -> _Collection | None:
        path = await self._dir(collection_id)
        try:
            state = json.loads((path / "state.json").read_text())
        except (OSError, ValueError):
            return None
        if state.get("format") != FORMAT or time.time() - state["checked_at"] > STALE_AFTER_S:
            return None  # the change log may have been cleaned past it: rebuild
        entry = _Collection(path, tantivy.Index(SCHEMA, path=str(path / "index")), state["applied_xmin"],
                            state["checked_at"], {int(k): v for k, v in state.get("seen", {}).items()},
                            written_at=state["checked_at"])
        self._open[collection_id] = entry
        return entry

    async def _catch_up(self, collection_id: int, entry: _Collection) -> bool:
        """Apply the change log's rows this index has not seen; False when it is too old to catch up."""
        async with self._db.connect() as conn:
            row = (await conn.execute(text(
                "SELECT extract(epoch FROM now()), pg_snapshot_xmin(pg_current_snapshot())::text::bigint, "
                "EXISTS (SELECT 1 FROM keyword_changes WHERE collection_id = :c "
                "AND xid >= CAST(CAST(:applied AS text) AS xid8) AND seq <> ALL(CAST(:seen AS bigint[])))"),
                {"c": collection_id, "applied": entry.applied_xmin, "seen": sorted(entry.seen)})).one()
        now, xmin, pending = float(row[0]), int(row[1]), bool(row[2])
        if now - entry.checked_at > STALE_AFTER_S:
            self._open.pop(collection_id, None)
            await asyncio.to_thread(shutil.rmtree, entry.path, True)
            return False
        if pending:
            async with entry.lock:
                await self._apply(collection_id, entry)
        else:
            # Everything this snapshot shows was applied; what it cannot show yet belongs to
            # transactions at or above its xmin, so the next check may start there.
            entry.seen = {seq: xid for seq, xid in entry.seen.items() if xid >= xmin}
            entry.applied_xmin, entry.checked_at = max(entry.applied_xmin, xmin), now
            if now - entry.written_at > 3600:
                await asyncio.to_thread(_write_state, entry.path, entry)
        return True

    async def _apply(self, collection_id: int, entry: _Collection) -> None:
        async with self._db.connect() as conn:
            conn = await conn.execution_options(isolation_level="REPEATABLE READ")
            async with conn.begin():
                # One snapshot for the log and the chunks: what it shows is applied, and every
                # transaction below its xmin is over, so the next check starts there.
                xmin, now = (await conn.execute(_SNAPSHOT)).one()
                changes = (await conn.execute(text(
                    "SELECT seq, xid::text::bigint, chunk_id FROM keyword_changes WHERE collection_id = :c "
                    "AND xid >= CAST(CAST(:applied AS text) AS xid8) AND seq <> ALL(CAST(:seen AS bigint[]))"),
                    {"c": collection_id, "applied": entry.applied_xmin, "seen": sorted(entry.seen)})).all()
                if not changes:  # another search applied them while this one waited for the lock
                    return
                ids = sorted({chunk_id for _, _, chunk_id in changes})
                rows = (await conn.execute(text(
                    f"SELECT c.id, {_LEXEMES} FROM chunks c WHERE c.id = ANY(:ids) "
                    "AND c.collection_id = :c AND c.embedding IS NOT NULL"), {"ids": ids, "c": collection_id})).all()
        await asyncio.to_thread(_replace, entry.index, ids, rows)
        # Rows at or above the new xmin will be listed again: remember them, and only them.
        seen = {**entry.seen, **{seq: xid for seq, xid, _ in changes}}
        entry.seen = {seq: xid for seq, xid in seen.items() if xid >= xmin}
        entry.applied_xmin, entry.checked_at = int(xmin), float(now)
        await asyncio.to_thread(_write_state, entry.path, entry)

    async def _build(self, collection_id: int) -> None:
        """Build the collection's index in a new directory and swap it in; a crash leaves only a
        temporary directory, removed by the next build."""
        final = await self._dir(collection_id)
        scratch = final.with_name(f"{final.name}.building-{os.getpid()}")
        started = time.perf_counter()
        try:
            await asyncio.to_thread(shutil.rmtree, scratch, True)
            (scratch / "index").mkdir(parents=True)
            index = tantivy.Index(SCHEMA, path=str(scratch / "index"))
            writer = index.writer(_WRITER_HEAP, 1)
            count = 0
            async with self._db.connect() as conn:
                conn = await conn.execution_options(isolation_level="REPEATABLE READ")
                async with conn.begin():
                    xmin, now = (await conn.execute(_SNAPSHOT)).one()
                    result = await conn.stream(text(
                        f"SELECT c.id, {_LEXEMES} FROM chunks c WHERE c.collection_id = :c "
                        "AND c.embedding IS NOT NULL"), {"c": collection_id})
                    async for batch in result.partitions(_BATCH):
                        await asyncio.to_thread(_add, writer, batch)
                        count += len(batch)
            await asyncio.to_thread(_commit, writer)
            await asyncio.to_thread(_write_state, scratch, _Collection(final, index, int(xmin), float(now)))
            del index, writer
            await asyncio.to_thread(_swap, scratch, final)
            entry = _Collection(final, tantivy.Index(SCHEMA, path=str(final / "index")), int(xmin), float(now),
                                written_at=float(now))
            self._open[collection_id] = entry
            log.info("keyword index of collection %s built: %d chunks in %.1f s", collection_id, count,
                     time.perf_counter() - started)
        except Exception:
            log.exception("building the keyword index of collection %s failed: answering from SQL", collection_id)
            await asyncio.to_thread(shutil.rmtree, scratch, True)

    async def close(self) -> None:
        for task in list(self._building.values()):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._open.clear()


def _write_state(path: Path, entry: _Collection) -> None:
    """What the index has applied, written after tantivy's commit: a crash in between only means
    the next check applies the same rows again (deleting and re-adding a chunk is idempotent)."""
    state = {"format": FORMAT, "applied_xmin": entry.applied_xmin, "checked_at": entry.checked_at,
             "seen": {str(seq): xid for seq, xid in entry.seen.items()}}
    scratch = path / "state.json.tmp"
    scratch.write_text(json.dumps(state))
    os.replace(scratch, path / "state.json")
    entry.written_at = entry.checked_at


def _statistics(explanation: str) -> tuple[float, float]:
    """N and avgdl from tantivy's explanation of one hit (what its BM25 used for every term)."""
    found: dict[str, float] = {}

    def walk(node: dict) -> None:
        description = node.get("description", "")
        if description.startswith("N,"):
            found["n"] = float(node["value"])
        elif description.startswith("avgdl"):
            found["avgdl"] = float(node["value"])
        for child in node.get("details", ()):
            walk(child)

    walk(json.loads(explanation))
    return found.get("n", 0.0), found.get("avgdl", 0.0)


def _add(writer: tantivy.IndexWriter, rows: list) -> None:
    for chunk_id, lexemes in rows:
        document = tantivy.Document(terms=lexemes, chunk=str(chunk_id))
        # add_unsigned: a plain int would be typed i64 or u64 by its size, and a column takes one type.
        document.add_unsigned("chunk_hi", chunk_id.int >> 64)
        document.add_unsigned("chunk_lo", chunk_id.int & _LOW_64)
        writer.add_document(document)


def _commit(writer: tantivy.IndexWriter) -> None:
    writer.commit()
    writer.wait_merging_threads()


def _replace(index: tantivy.Index, chunk_ids: list[uuid.UUID], rows: list) -> None:
    """Delete every changed chunk and add back those that still exist (idempotent)."""
    writer = index.writer(_WRITER_HEAP, 1)  # raises ValueError while another process holds the lock
    for chunk_id in chunk_ids:
        writer.delete_documents_by_term("chunk", str(chunk_id))
    _add(writer, rows)
    _commit(writer)
    index.reload()


def _swap(scratch: Path, final: Path) -> None:
    if final.exists():
        shutil.rmtree(final)
    scratch.rename(final)
