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
transactions at or above its last snapshot's xmin that it has not applied yet. The log is pruned
below a transaction-id mark at least a day old (migration 0014); an index behind that mark rebuilds.

Its scores are candidates, not answers: tantivy keeps a chunk's length in one byte (rounded down),
so its BM25 is an upper bound of the exact one. ``bm25.py`` rescores the candidates exactly and
proves that nothing outside them can do better, or asks for more.

One process owns a data dir's indexes (an exclusive ``flock`` held for its life): the server,
normally. Another process on the same data dir (a CLI command while the server runs), a search
while an index is built or a long apply runs, answers with the SQL scoring instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import tantivy
from sqlalchemy import text

from rag_service.db.engine import Database

log = logging.getLogger(__name__)

FORMAT = 2  # 2: the chunk id in two u64 fast fields (read without fetching stored documents)
K1, B = 1.2, 0.75  # tantivy's BM25 parameters: its scores bound the SQL scoring's only with these
APPLY_WAIT_S = 2.0  # how long a search waits for another search's apply before scoring in SQL
RETRY_AFTER_S = 60.0  # a failed build, or a data dir another process owns, is tried again after this
# A collection found smaller than ``min_chunks`` is scored in SQL without asking its size again for
# this long: the question is a statement of its own before every search (1.2 / 4.1 ms p50 / p95 on
# XQuAD's 240 paragraphs, in process). One that grows past it meanwhile is still scored exactly,
# in SQL, until the next look.
SMALL_RECHECK_S = 30.0
_BATCH = 5000
_WRITER_HEAP = 64_000_000
_STATE_EVERY_S = 600.0  # how often an index that applied nothing new records its progress
# A chunk's lexemes, each repeated tf times (tf counted as the postings trigger counts it).
_LEXEMES = ("(SELECT coalesce(string_agg(repeat(u.lexeme || ' ', coalesce(array_length(u.positions, 1), 1)), ''), '') "
            "FROM unnest(c.tsv) u)")
_LOW_64 = (1 << 64) - 1
_SNAPSHOT = text("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint")
# The change rows an index has not applied: its collection's, from transactions at or above its
# last xmin, less those it already applied there.
_UNSEEN = ("FROM keyword_changes WHERE collection_id = :c AND xid >= CAST(CAST(:applied AS text) AS xid8) "
           "AND seq <> ALL(CAST(:seen AS bigint[]))")
_PENDING = text(
    "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint, "
    f"(SELECT below::text::bigint FROM keyword_changes_pruned), EXISTS (SELECT 1 {_UNSEEN})")


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
    applied_xmin: int  # every transaction below this had finished when last applied
    seen: dict[int, int] = field(default_factory=dict)  # change rows (seq: xid) at or above it, applied
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    written_at: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class Candidates:
    """tantivy's best ``depth`` chunks for a query, with its (upper-bound) scores."""

    chunk_ids: list[uuid.UUID]
    scores: list[float]
    doc_freqs: dict[str, int]        # chunks holding each term now (what the SQL scoring counts)
    index_doc_freqs: dict[str, int]  # as tantivy scored them: deleted chunks count until merged
    total_docs: float                # N and average length as tantivy scored them (deleted ones too)
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
        self.answered = 0   # searches answered from the index
        self.proven = 0     # ... of which by the bound (the others held every matching chunk)
        self.fell_back = 0  # searches the SQL scoring answered (not ready, not owned, or no proof)
        self.builds = 0
        self._open: dict[int, _Collection] = {}
        self._small_at: dict[str, float] = {}  # collection name -> when it was found below min_chunks
        self._building: dict[int, asyncio.Task[None]] = {}
        self._failed_at: dict[int, float] = {}
        self._database_dir: Path | None = None
        self._owner: IO[bytes] | None = None
        self._owner_tried_at = -RETRY_AFTER_S

    def known_small(self, collection: str) -> bool:
        """Whether ``collection`` was found below ``min_chunks`` in the last SMALL_RECHECK_S."""
        return time.monotonic() - self._small_at.get(collection, -SMALL_RECHECK_S) < SMALL_RECHECK_S

    def found_small(self, collection: str) -> None:
        self._small_at[collection] = time.monotonic()

    async def _home(self) -> Path | None:
        """This database's directory, if this process owns it (else None: answer from SQL)."""
        if self._database_dir is None:
            # One directory per database: a data dir pointed at another server must not reuse an index.
            async with self._db.connect() as conn:
                ident = (await conn.execute(text(
                    "SELECT system_identifier::text || '-' || current_database() FROM pg_control_system()"
                ))).scalar_one()
            self._database_dir = self._root / ident
        if self._owner is None and time.monotonic() - self._owner_tried_at >= RETRY_AFTER_S:
            self._owner_tried_at = time.monotonic()
            self._owner = await asyncio.to_thread(_take_ownership, self._database_dir)
        return self._database_dir if self._owner is not None else None

    async def current(self, collection_id: int, *, wait: bool = False) -> _Collection | None:
        """The collection's index with every committed change applied, or None when the SQL
        scoring must answer: the index is being built (``wait`` builds it now), being updated by
        another search for longer than APPLY_WAIT_S, too far behind the change log, or owned by another process."""
        home = await self._home()
        if home is None:
            return None
        entry = self._open.get(collection_id) or await asyncio.to_thread(self._load, home, collection_id)
        if entry is None:
            if time.monotonic() - self._failed_at.get(collection_id, -RETRY_AFTER_S) < RETRY_AFTER_S:
                return None
            task = self._building.get(collection_id)
            if task is None:
                task = asyncio.create_task(self._build(home, collection_id))
                self._building[collection_id] = task
                task.add_done_callback(lambda _t: self._building.pop(collection_id, None))
            if not wait and self._background:
                return None
            await asyncio.shield(task)
            entry = self._open.get(collection_id)
            if entry is None:
                return None
        try:
            if await self._catch_up(collection_id, entry):
                return entry
        except (OSError, ValueError, TimeoutError) as exc:  # tantivy's writer or the disk failed, or a long apply
            log.warning("keyword index of collection %s not current (%r): answering from SQL", collection_id, exc)
            return None
        # Behind the pruned log: removed, so this builds a new one (or starts building it).
        return await self.current(collection_id, wait=wait)

    async def ready(self, collection_id: int) -> bool:
        """Build (or catch up) the collection's index now; True when searches will use it."""
        return await self.current(collection_id, wait=True) is not None

    @staticmethod
    def candidates(searcher: tantivy.Searcher, terms: list[str], depth: int) -> Candidates:
        """tantivy's top ``depth`` (blocking: call it off the event loop)."""
        query = tantivy.Query.boolean_query(
            [(tantivy.Occur.Should, tantivy.Query.term_query(SCHEMA, "terms", t)) for t in terms])
        # count=False: counting every match would visit every posting, which is what this avoids.
        hits = searcher.search(query, depth, count=False).hits
        index_doc_freqs = {t: searcher.doc_freq("terms", t) for t in terms}
        total, avgdl = float(searcher.num_docs), 0.0
        if hits:
            total, avgdl = _statistics(query.explain(searcher, hits[0][1]).to_json())
        doc_freqs = index_doc_freqs
        if total != searcher.num_docs:  # deleted chunks not merged away yet: count the live ones
            doc_freqs = {t: searcher.search(tantivy.Query.term_query(SCHEMA, "terms", t), 1).count for t in terms}
        addresses = [address for _, address in hits]
        ids = [uuid.UUID(int=hi << 64 | lo) for hi, lo in zip(searcher.fast_field_values("chunk_hi", addresses),
                                                            searcher.fast_field_values("chunk_lo", addresses),
                                                            strict=True)]
        return Candidates(ids, [score for score, _ in hits], doc_freqs, index_doc_freqs, total, avgdl)

    def _load(self, home: Path, collection_id: int) -> _Collection | None:
        path = home / str(collection_id)
        try:
            state = json.loads((path / "state.json").read_text())
            if state.get("format") != FORMAT:
                return None
            entry = _Collection(path, tantivy.Index(SCHEMA, path=str(path / "index")), int(state["applied_xmin"]),
                                {int(k): int(v) for k, v in state.get("seen", {}).items()})
        except (OSError, ValueError, KeyError):
            return None  # missing or torn: rebuild
        self._open[collection_id] = entry
        return entry

    async def _catch_up(self, collection_id: int, entry: _Collection) -> bool:
        """Apply the change log's rows this index has not seen; False when it is behind what the
        log still holds (it is then removed, and rebuilt by the next search)."""
        async with self._db.connect() as conn:
            xmin, pruned_below, pending = (await conn.execute(_PENDING, {
                "c": collection_id, "applied": entry.applied_xmin, "seen": sorted(entry.seen)})).one()
        if entry.applied_xmin < int(pruned_below):
            self._open.pop(collection_id, None)
            await asyncio.to_thread(shutil.rmtree, entry.path, True)
            return False
        if pending:
            # Searches wait for one apply (usually tens of ms) rather than score in SQL, which at a
            # million chunks takes seconds; an apply that runs long (a bulk load) sends them to SQL.
            async with asyncio.timeout(APPLY_WAIT_S):
                await entry.lock.acquire()
            try:
                await self._apply(collection_id, entry)  # applies nothing if another search just did
            finally:
                entry.lock.release()
        else:
            # Everything this snapshot shows was applied; what it cannot show yet belongs to
            # transactions at or above its xmin, so the next check may start there.
            entry.seen = {seq: xid for seq, xid in entry.seen.items() if xid >= xmin}
            entry.applied_xmin = max(entry.applied_xmin, int(xmin))
            if time.monotonic() - entry.written_at > _STATE_EVERY_S:
                await asyncio.to_thread(_write_state, entry.path, entry)
        return True

    async def _apply(self, collection_id: int, entry: _Collection) -> None:
        async with self._db.connect() as conn:
            conn = await conn.execution_options(isolation_level="REPEATABLE READ")
            async with conn.begin():
                # One snapshot for the log and the chunks: what it shows is applied, and every
                # transaction below its xmin is over, so the next check starts there.
                xmin = (await conn.execute(_SNAPSHOT)).scalar_one()
                changes = (await conn.execute(text(f"SELECT seq, xid::text::bigint, chunk_id {_UNSEEN}"),
                    {"c": collection_id, "applied": entry.applied_xmin, "seen": sorted(entry.seen)})).all()
                if not changes:
                    return
                ids = sorted({chunk_id for _, _, chunk_id in changes})
                rows = (await conn.execute(text(
                    f"SELECT c.id, {_LEXEMES} FROM chunks c WHERE c.id = ANY(:ids) "
                    "AND c.collection_id = :c AND c.embedding IS NOT NULL"), {"ids": ids, "c": collection_id})).all()
        if ids:
            await asyncio.to_thread(_replace, entry.index, ids, rows)
        # Rows at or above the new xmin will be listed again: remember them, and only them.
        seen = {**entry.seen, **{seq: xid for seq, xid, _ in changes}}
        entry.seen = {seq: xid for seq, xid in seen.items() if xid >= xmin}
        entry.applied_xmin = int(xmin)
        await asyncio.to_thread(_write_state, entry.path, entry)

    async def _build(self, home: Path, collection_id: int) -> None:
        """Build the collection's index in a scratch directory and swap it in. A crash leaves only
        the scratch directory, which the next build (by the process owning the data dir) removes."""
        final = home / str(collection_id)
        scratch = final.with_name(f"{final.name}.building")
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
                    xmin = (await conn.execute(_SNAPSHOT)).scalar_one()
                    result = await conn.stream(text(
                        f"SELECT c.id, {_LEXEMES} FROM chunks c WHERE c.collection_id = :c "
                        "AND c.embedding IS NOT NULL"), {"c": collection_id})
                    async for batch in result.partitions(_BATCH):
                        await asyncio.to_thread(_add, writer, batch)
                        count += len(batch)
            await asyncio.to_thread(_commit, writer)
            await asyncio.to_thread(_write_state, scratch, _Collection(final, index, int(xmin)))
            del index, writer
            await asyncio.to_thread(_swap, scratch, final)
            self._open[collection_id] = _Collection(final, tantivy.Index(SCHEMA, path=str(final / "index")), int(xmin))
            self.builds += 1
            log.info("keyword index of collection %s built: %d chunks in %.1f s", collection_id, count,
                     time.perf_counter() - started)
        except BaseException as exc:
            shutil.rmtree(scratch, ignore_errors=True)
            if not isinstance(exc, Exception):
                raise  # cancelled (the server is stopping): nothing to retry
            self._failed_at[collection_id] = time.monotonic()
            log.exception("building the keyword index of collection %s failed: answering from SQL for %.0f s",
                          collection_id, RETRY_AFTER_S)

    async def close(self) -> None:
        for task in list(self._building.values()):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._open.clear()
        if self._owner is not None:
            self._owner.close()  # releases the flock
            self._owner = None


def _take_ownership(home: Path) -> IO[bytes] | None:
    """An exclusive, non-blocking flock on the data dir's index directory, held while the file
    stays open (the kernel drops it if the process dies); None if another process holds it."""
    home.mkdir(parents=True, exist_ok=True)
    handle = (home / "owner.lock").open("ab")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        log.info("keyword indexes in %s belong to another process: keyword search is scored in SQL here", home)
        return None
    return handle


def _write_state(path: Path, entry: _Collection) -> None:
    """What the index has applied, written after tantivy's commit: a crash in between only means
    the next check applies the same rows again (deleting and re-adding a chunk is idempotent)."""
    state = {"format": FORMAT, "applied_xmin": entry.applied_xmin,
             "seen": {str(seq): xid for seq, xid in entry.seen.items()}}
    scratch = path / "state.json.tmp"
    scratch.write_text(json.dumps(state))
    os.replace(scratch, path / "state.json")
    entry.written_at = time.monotonic()


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
