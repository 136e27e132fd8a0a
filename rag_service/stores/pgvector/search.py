"""Searches on the pgvector store that read ``chunks`` directly: nearest neighbours, full text,
structured filter, patterns, and reads by id.

Every search is a SQLAlchemy Core statement over ``chunks`` joined to ``documents``; every
filter, the ACL check included, is part of the WHERE clause.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np
from sqlalchemy import Float, Select, cast, func, literal, select, text, true
from sqlalchemy.dialects.postgresql import REGCONFIG
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import ColumnElement

from rag_service.db.models import Chunk, Document
from rag_service.domain import SearchFilter, SearchHit
from rag_service.errors import InvalidInputError, PatternTooCommonError
from rag_service.stores.base import PatternMode, RecencyOrder
from rag_service.stores.patterns import escape_like, validate_pattern
from rag_service.stores.pgvector.connection import PgStoreBase
from rag_service.stores.pgvector.filters import build_filter, check_top_k
from rag_service.stores.pgvector.half import half_distance

HNSW_MAX_EF_SEARCH = 1000  # pgvector's upper bound for hnsw.ef_search
WIDEN_MARGIN = 1.5  # read this many times the candidates the filter's observed share implies
# pgvector 0.8's iterative scan, measured at 1,000,000 chunks (ad hoc, 30 queries; docs/benchmarks.md,
# "Scale"): under a 10% filter it gave top 100 in 51 ms at recall 0.91 where the exact scan took 821 ms,
# and ef_search 400 lifted that recall to 0.94 at the same latency. Under filters keeping 1% or
# less it was worse than the exact scan (top 10 under 0.1%: 208 ms at recall 0.76 against 21 ms and
# 1.0), so it is asked for only when the first scan showed the filter keeps at least this share.
ITERATIVE_EF_SEARCH = 400
ITERATIVE_MIN_SHARE = 0.05
EF_SEARCH_INFO = "rag_service.hnsw_ef_search"  # the session's hnsw.ef_search, in the connection's info


def widened_ef_search(ef_search: int, kept: int, top_k: int) -> int | None:
    """The ``ef_search`` for a second HNSW scan after a filter kept ``kept`` of ``ef_search``
    candidates (fewer than ``top_k``), or None when an exact scan is the better second step.

    The index hands over ef_search candidates and the filter applies after (pgvector 0.8's
    iterative scans aside, which second_scan asks for separately), so a filter keeping a share s
    of the rows leaves about s * ef_search. The observed share predicts the ef_search that leaves
    top_k. When the filter kept none, it keeps under 1/ef_search of the rows, few enough to scan
    exactly; when the prediction passes pgvector's bound, too. (Going to the bound when it would
    only just leave top_k was measured worse: at 1,000,000 chunks, top 100 under a 10% filter fell
    short half the time and paid an index scan of 1,000 and the exact scan, p95 624 ms.)

    When the filter keeps fewer than top_k rows in all, the second scan cannot help and the exact
    scan follows it: one index scan too many, which only a count of the filter's rows would save."""
    if kept <= 0 or kept >= top_k or ef_search >= HNSW_MAX_EF_SEARCH:
        return None
    wanted = math.ceil(WIDEN_MARGIN * top_k * ef_search / kept)
    return wanted if wanted <= HNSW_MAX_EF_SEARCH else None


def second_scan(ef_search: int, kept: int, top_k: int, *, iterative: bool) -> tuple[str, int] | None:
    """After an index scan at ``ef_search`` whose filter kept ``kept`` (fewer than ``top_k``) rows:
    ("widen", ef) for a second scan with a wider ef_search, ("iterative", ef) for pgvector 0.8's
    iterative scan (``iterative``: the server has it), or None when an exact scan is the better
    second step.

    Widening comes first where it fits (``widened_ef_search``). Where it does not, the iterative
    scan is the second step when the filter kept at least ITERATIVE_MIN_SHARE of the candidates
    (a share seen in several rows, not one): such a filter keeps many rows, which an exact scan
    would read one by one, and there the iterative scan is fast at about the recall HNSW has
    without a filter. A filter that kept less is selective enough for the exact scan, which there
    was faster and exact (ITERATIVE_MIN_SHARE's measurements)."""
    if kept >= top_k:
        return None
    if (wider := widened_ef_search(ef_search, kept, top_k)) is not None:
        return "widen", wider
    if iterative and kept >= ITERATIVE_MIN_SHARE * ef_search:
        return "iterative", min(HNSW_MAX_EF_SEARCH, max(ef_search, ITERATIVE_EF_SEARCH))
    return None


def base_select(score: ColumnElement[Any]) -> Select[Any]:
    """The columns a SearchHit is made of, with ``score`` as its score; callers add WHERE and ORDER BY."""
    return (
        select(
            Chunk.id, Chunk.document_id, Chunk.parent_id, Chunk.ordinal, Document.source_uri, Document.title,
            Chunk.text, Chunk.start_char, Chunk.end_char, Chunk.metadata_.label("chunk_metadata"),
            Document.effective_date, Document.updated_at, score.label("score"),
        )
        .select_from(Chunk)
        .join(Document, Document.id == Chunk.document_id)
    )


def to_hits(rows: Sequence[Any]) -> list[SearchHit]:
    """Rows of a ``base_select`` statement as SearchHits, in order."""
    return [
        SearchHit(
            chunk_id=r.id, document_id=r.document_id, parent_id=r.parent_id, ordinal=r.ordinal,
            source_uri=r.source_uri, title=r.title, text=r.text, start_char=r.start_char,
            end_char=r.end_char, score=float(r.score), metadata=r.chunk_metadata or {},
            document_date=r.effective_date or r.updated_at,
        )
        for r in rows
    ]


def _query_vector(embedding: Sequence[float], dim: int) -> np.ndarray:
    """The query embedding as the store compares it, refused when no cosine can be taken."""
    if len(embedding) != dim:
        raise InvalidInputError(f"query embedding has {len(embedding)} dimensions; the store holds {dim}")
    vector = np.asarray(embedding, dtype=np.float32)
    if not np.isfinite(vector).all() or not np.any(vector):
        raise InvalidInputError("query embedding must be finite and not all zeros (cosine is undefined)")
    return vector


class PgSearches(PgStoreBase):
    """Vector, full-text, metadata and pattern search, and reads of stored chunks by id."""

    def vector_query(self, embedding: Sequence[float], flt: SearchFilter, top_k: int, dim: int,
                     half: bool = False) -> Select[Any]:
        """The nearest-neighbour statement (public so its plan can be inspected with EXPLAIN);
        ``half``: ordered as the half-precision index walks."""
        check_top_k(top_k)
        vector = _query_vector(embedding, dim)
        distance = Chunk.embedding.cosine_distance(vector)
        # The score is the full-precision cosine either way; with the half-precision index only
        # the order (the walk through the graph) is in half precision.
        order = half_distance(vector, dim) if half else distance
        return (
            base_select(1 - distance)
            .where(Chunk.embedding.is_not(None), *build_filter(flt))
            .order_by(order)
            .limit(top_k)
        )

    async def vector_search(
        self, embedding: Sequence[float], flt: SearchFilter, top_k: int, *, exact: bool = False
    ) -> list[SearchHit]:
        schema = await self.schema()
        half = not exact and await self._walk_half_index()
        stmt = self.vector_query(embedding, flt, top_k, schema.embedding_dimension, half=half)
        ef_search = max(self._ef_search, top_k)
        async with self._db.connect() as conn:
            if not exact:
                await self._use_ef_search(conn, ef_search)
            rows = [] if exact else (await conn.execute(stmt)).all()
            # HNSW applies filters after the index scan, so a selective filter (or ACL) can leave
            # fewer than top_k. How many it kept tells how selective it is, and so the next step.
            step = None if exact else second_scan(ef_search, len(rows), top_k, iterative=schema.iterative_scans)
            if step is not None:
                kind, ef = step
                if kind == "iterative":
                    # pgvector 0.8 keeps scanning the graph until the filters have let top_k through.
                    self.vector_iterative += 1
                    await conn.execute(text("SET LOCAL hnsw.iterative_scan = strict_order"))
                else:
                    self.vector_widened += 1
                await conn.execute(text(f"SET LOCAL hnsw.ef_search = {ef}"))
                rows = (await conn.execute(stmt)).all()
            if len(rows) < top_k:
                self.vector_exact_fallbacks += not exact
                # Still short (a very selective filter, or past the iterative scan's limit). Re-run exactly:
                # ordering by an expression the index cannot serve makes PostgreSQL scan only the
                # rows the other conditions select (so hnsw.iterative_scan, if set, plays no part).
                distance = Chunk.embedding.cosine_distance(np.asarray(embedding, dtype=np.float32))
                rows = (await conn.execute(stmt.order_by(None).order_by(distance + 0))).all()
            elif half:
                # Walked in half precision, scored in full: near ties can swap, so order by the score.
                rows = sorted(rows, key=lambda row: -row.score)
        return to_hits(rows)

    async def _use_ef_search(self, conn: AsyncConnection, ef_search: int) -> None:
        """Make ``ef_search`` the value this transaction's index scans use. The store's own value
        is set once per connection, for the session, and remembered in the connection's ``info``
        (which SQLAlchemy empties when it opens a new connection); any other value (a top k above
        it) is SET LOCAL. A SET LOCAL in every search was one more round trip before each search:
        0.7 ms p50 on XQuAD's collection, in the query's critical path. (This assumes each pooled
        connection is one server session, as with a direct connection or a session-pooling proxy;
        behind transaction pooling the session value would reach other clients.)"""
        if conn.info.get(EF_SEARCH_INFO) == ef_search:
            return
        if ef_search != self._ef_search:
            await conn.execute(text(f"SET LOCAL hnsw.ef_search = {ef_search}"))
            return
        await conn.execute(text(f"SET hnsw.ef_search = {ef_search}"))
        await conn.commit()  # a session SET is undone with the transaction that made it
        conn.info[EF_SEARCH_INFO] = ef_search

    async def text_search(self, query: str, flt: SearchFilter, top_k: int) -> list[SearchHit]:
        check_top_k(top_k)
        if not query.strip():
            raise InvalidInputError("text query must not be empty")
        config = cast(literal((await self.schema()).text_search_config), REGCONFIG)
        tsquery = func.websearch_to_tsquery(config, query.replace("\x00", ""))
        rank = func.ts_rank_cd(Chunk.tsv, tsquery)
        stmt = (
            base_select(cast(rank, Float))
            .where(Chunk.tsv.op("@@")(tsquery), Chunk.embedding.is_not(None), *build_filter(flt))
            .order_by(rank.desc(), Chunk.id)
            .limit(top_k)
        )
        async with self._db.connect() as conn:
            rows = (await conn.execute(stmt)).all()
        return to_hits(rows)

    async def metadata_search(
        self, flt: SearchFilter, top_k: int, order: RecencyOrder = "newest"
    ) -> list[SearchHit]:
        check_top_k(top_k)
        if order not in ("newest", "oldest"):
            raise InvalidInputError(f"order must be 'newest' or 'oldest', not {order!r}")
        document_date = func.coalesce(Document.effective_date, Document.updated_at)
        stmt = (
            base_select(func.extract("epoch", document_date))
            .where(Chunk.embedding.is_not(None), *build_filter(flt))
            .order_by(document_date.desc() if order == "newest" else document_date.asc(),
                      Chunk.document_id, Chunk.ordinal)
            .limit(top_k)
        )
        async with self._db.connect() as conn:
            rows = (await conn.execute(stmt)).all()
        hits = to_hits(rows)
        # Structured matches carry no relevance: the score is the reciprocal rank in date order.
        return [hit.model_copy(update={"score": 1.0 / rank}) for rank, hit in enumerate(hits, start=1)]

    async def pattern_search(
        self, pattern: str, flt: SearchFilter, top_k: int, mode: PatternMode = "literal",
        case_sensitive: bool = False, prefilter: str | None = None, max_matches: int | None = None,
    ) -> list[SearchHit]:
        check_top_k(top_k)
        if max_matches is not None and max_matches < 1:
            raise InvalidInputError("max_matches must be >= 1")
        validate_pattern(pattern, mode)
        config = cast(literal((await self.schema()).text_search_config), REGCONFIG)
        if mode == "literal":
            like = "%" + escape_like(pattern) + "%"
            matches = Chunk.text.like(like, escape="\\") if case_sensitive else Chunk.text.ilike(like, escape="\\")
            haystack = Chunk.text if case_sensitive else func.lower(Chunk.text)
            needle = pattern if case_sensitive else pattern.lower()
            occurrences = (func.length(haystack) - func.length(func.replace(haystack, needle, ""))) / len(needle)
        else:
            matches = Chunk.text.op("~" if case_sensitive else "~*")(pattern)
            flags = "g" if case_sensitive else "gi"
            occurrences = (
                select(func.count()).select_from(func.regexp_matches(Chunk.text, pattern, flags).alias("m"))
                .scalar_subquery()
            )
        score = cast(occurrences, Float)
        conditions = [matches, Chunk.embedding.is_not(None), *build_filter(flt)]
        phrase = func.phraseto_tsquery(config, (prefilter or "").replace("\x00", ""))
        async with self._db.connect() as conn:
            if mode == "regex":
                # PostgreSQL's regex dialect (ARE) is what runs: let it judge the pattern.
                try:
                    await conn.execute(text("SELECT '' ~ :p"), {"p": pattern})
                except DBAPIError as exc:
                    await conn.rollback()
                    raise InvalidInputError(
                        f"invalid regex {pattern!r}: {str(exc.orig).splitlines()[0]}. Patterns use PostgreSQL "
                        "syntax (\\y for a word boundary, no named groups)"
                    ) from None
            if prefilter and (await conn.execute(select(func.numnode(phrase)))).scalar_one() > 0:
                # The full-text index narrows the scan to chunks holding the phrase's words in
                # order; the pattern then runs on those instead of on every chunk.
                conditions.append(Chunk.tsv.op("@@")(phrase))
            await conn.execute(text(f"SET LOCAL statement_timeout = {int(self._pattern_timeout_ms)}"))
            try:
                order = (score.desc(), Chunk.document_id, Chunk.ordinal)
                if max_matches is None:
                    rows = (await conn.execute(base_select(score).where(*conditions).order_by(*order)
                                               .limit(top_k))).all()
                else:
                    # The scan stops at max_matches + 1 matches, and they are scored only when the
                    # pattern is not too common; otherwise, and when nothing matched, the statement
                    # gives one row: the count beside NULLs. (Scoring them regardless, the too
                    # common "IL-6" at 1,000,000 chunks spent 16 of its 35 ms counting occurrences in
                    # 1,001 matches it then dropped.)
                    found = (select(Chunk.id).select_from(Chunk).join(Document, Document.id == Chunk.document_id)
                             .where(*conditions).limit(max_matches + 1).cte("found"))
                    counted = select(func.count().label("matched")).select_from(found).cte("counted")
                    scored = (base_select(score)
                              .where(Chunk.id.in_(select(found.c.id)), counted.c.matched <= max_matches)
                              .order_by(*order).limit(top_k).lateral("scored"))
                    rows = (await conn.execute(
                        select(counted.c.matched, scored).select_from(counted.outerjoin(scored, true()))
                        .order_by(scored.c.score.desc(), scored.c.document_id, scored.c.ordinal))).all()
                    if rows[0].matched > max_matches:
                        raise PatternTooCommonError(
                            f"pattern {pattern!r} is in more than {max_matches} chunks; make it more specific "
                            "or narrow the filter")
                    rows = [row for row in rows if row.id is not None]
            except DBAPIError as exc:
                if "statement timeout" in str(exc.orig):
                    raise InvalidInputError(
                        f"pattern {pattern!r} took longer than {self._pattern_timeout_ms} ms; "
                        "make it more specific or narrow the filter"
                    ) from exc
                raise
        return to_hits(rows)

    async def chunks_by_id(
        self, chunk_ids: Sequence[uuid.UUID], *, with_embeddings: bool = False
    ) -> dict[uuid.UUID, tuple[SearchHit, np.ndarray | None]]:
        """Stored chunks by id (parents included), each with its embedding when asked. No ACL
        check: callers pass ids that came out of a filtered search (or their parents)."""
        if not chunk_ids:
            return {}
        columns = [Chunk.embedding] if with_embeddings else []
        stmt = base_select(literal(0.0, Float)).add_columns(*columns).where(Chunk.id.in_(list(chunk_ids)))
        async with self._db.connect() as conn:
            rows = (await conn.execute(stmt)).all()
        hits = to_hits(rows)
        return {
            hit.chunk_id: (hit, np.asarray(row.embedding, dtype=np.float32) if with_embeddings
                           and row.embedding is not None else None)
            for hit, row in zip(hits, rows, strict=True)
        }

    async def similarities_by_id(
        self, chunk_ids: Sequence[uuid.UUID], embedding: Sequence[float]
    ) -> dict[uuid.UUID, float]:
        """Cosine similarities computed where the vectors are: the local reranker asks for a couple
        of hundred per query, and sending one number per chunk instead of its vector halves the
        call (200 candidates at 1,000,000 chunks: 2.8 ms against 5.8 ms at p50; docs/benchmarks.md).
        The expression is ``vector_search``'s score, so a semantic hit gets the same number."""
        if not chunk_ids:
            return {}
        vector = _query_vector(embedding, (await self.schema()).embedding_dimension)
        async with self._db.connect() as conn:
            raw = await self._raw_with_vector(conn)
            async with raw.cursor(binary=True) as cur:
                await cur.execute("SELECT id, 1 - (embedding <=> %s) FROM chunks "
                                  "WHERE id = ANY(%s) AND embedding IS NOT NULL", (vector, list(chunk_ids)))
                # A stored vector of zeros has no cosine (pgvector gives NaN): absent, like no vector.
                return {chunk_id: cosine for chunk_id, cosine in await cur.fetchall() if not math.isnan(cosine)}
