"""PgVectorStore: the VectorStore adapter on PostgreSQL + pgvector.

Searches are SQLAlchemy Core statements over ``chunks`` joined to ``documents``; every filter,
the ACL check included, is part of the WHERE clause. Bulk writes go through binary COPY into a
temporary table and one INSERT ... ON CONFLICT, so a batch is a handful of round trips.
"""

from __future__ import annotations

import re
import time
import uuid
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pgvector.psycopg import register_vector_async
from psycopg.types.json import Jsonb
from sqlalchemy import (
    CTE,
    Float,
    Numeric,
    Select,
    bindparam,
    case,
    cast,
    column,
    delete,
    func,
    literal,
    or_,
    select,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, REGCONFIG, insert
from sqlalchemy.dialects.postgresql import TEXT as PG_TEXT
from sqlalchemy.dialects.postgresql import UUID as PG_UUID
from sqlalchemy.exc import DBAPIError, ProgrammingError
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.base import Executable
from sqlalchemy.sql.elements import ClauseElement, ColumnElement

from rag_service.db.engine import Database
from rag_service.db.models import Chunk, Collection, Document
from rag_service.domain import ChunkRecord, DocumentRecord, SearchFilter, SearchHit
from rag_service.errors import InvalidInputError, SchemaMismatchError
from rag_service.stores.base import PatternMode, RecencyOrder, StoreCounts
from rag_service.stores.patterns import escape_like, validate_pattern

_CHUNK_COLUMNS = (
    "id", "document_id", "parent_id", "ordinal", "text", "start_char", "end_char",
    "token_count", "content_hash", "metadata", "embedding",
)
_CHUNK_TYPES = ("uuid", "uuid", "uuid", "int4", "text", "int4", "int4", "int4", "text", "jsonb", "vector")
MAX_TOP_K = 1000
# Stored in place of an empty ACL, and granted to every caller. One array-overlap test then
# covers public and restricted documents, and PostgreSQL estimates it from the column's element
# statistics (an OR with cardinality() = 0 was estimated at 0.5% and steered plans off HNSW).
PUBLIC_PRINCIPAL = "*"
_PHRASE = re.compile(r'"[^"]+"')
_EXCLUSION = re.compile(r"(?:^|\s)(-\w[\w-]*)")


def web_search_restriction(query: str) -> str | None:
    """The parts of a query that must hold for a chunk to match at all: quoted phrases and
    -exclusions, in websearch_to_tsquery syntax; None when the query has neither."""
    parts = _PHRASE.findall(query) + _EXCLUSION.findall(_PHRASE.sub(" ", query))
    return " ".join(parts) or None


@dataclass(frozen=True)
class SchemaInfo:
    embedding_dimension: int
    text_search_config: str
    has_trgm: bool


def strip_nul(value: Any) -> Any:
    """PostgreSQL text and jsonb cannot hold NUL characters; drop them wherever they hide."""
    if isinstance(value, str):
        return value.replace("\x00", "")
    if isinstance(value, dict):
        return {strip_nul(k): strip_nul(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [strip_nul(v) for v in value]
    return value


def build_filter(flt: SearchFilter, *, scope_chunks: bool = True) -> list[ColumnElement[bool]]:
    """WHERE clauses for a SearchFilter over ``chunks`` joined to ``documents``. With
    ``scope_chunks=False`` only the clauses on ``documents`` (the caller scopes the collection)."""
    d = Document.__table__.c
    clauses: list[ColumnElement[bool]] = []
    if flt.collection is not None and scope_chunks:
        collection_id = select(Collection.id).where(Collection.name == flt.collection).scalar_subquery()
        clauses.append(Chunk.collection_id == collection_id)
    if not flt.acl_bypass:
        granted = [PUBLIC_PRINCIPAL, *flt.principals]
        clauses.append(d.acl.overlap(cast(granted, ARRAY(PG_TEXT))))
    if flt.metadata_equals:
        clauses.append(d.metadata.op("@>")(cast(flt.metadata_equals, JSONB)))
    for key, options in flt.metadata_in.items():
        clauses.append(or_(*[d.metadata.op("@>")(cast({key: option}, JSONB)) for option in options]))
    for key, bounds in flt.metadata_range.items():
        value: ColumnElement[Any]
        if any(isinstance(b, str) for b in (bounds.gte, bounds.gt, bounds.lte, bounds.lt)):
            value = d.metadata[key].astext
        else:
            # CASE keeps the cast from ever seeing a non-numeric value.
            value = case((func.jsonb_typeof(d.metadata[key]) == "number", cast(d.metadata[key].astext, Numeric)))
        if bounds.gte is not None:
            clauses.append(value >= bounds.gte)
        if bounds.gt is not None:
            clauses.append(value > bounds.gt)
        if bounds.lte is not None:
            clauses.append(value <= bounds.lte)
        if bounds.lt is not None:
            clauses.append(value < bounds.lt)
    document_date = func.coalesce(d.effective_date, d.updated_at)
    if flt.date_from is not None:
        clauses.append(document_date >= flt.date_from)
    if flt.date_to is not None:
        clauses.append(document_date <= flt.date_to)
    if flt.lob is not None:
        clauses.append(d.lob == flt.lob)
    if flt.tags_any:
        clauses.append(d.tags.overlap(cast(list(flt.tags_any), ARRAY(PG_TEXT))))
    return clauses


class Explain(Executable, ClauseElement):
    """``EXPLAIN <statement>``, with the statement's parameters bound as usual."""

    inherit_cache = False

    def __init__(self, statement: Select[Any]) -> None:
        self.statement = statement


@compiles(Explain, "postgresql")
def _compile_explain(element: Explain, compiler: Any, **kw: Any) -> str:
    return "EXPLAIN " + compiler.process(element.statement, **kw)


def _check_top_k(top_k: int) -> None:
    if not 1 <= top_k <= MAX_TOP_K:
        raise InvalidInputError(f"top_k must be between 1 and {MAX_TOP_K}, got {top_k}")


class PgVectorStore:
    def __init__(self, db: Database, *, ef_search: int = 40, pattern_timeout_ms: int = 2000) -> None:
        if ef_search < 1:
            raise ValueError("ef_search must be >= 1")
        if pattern_timeout_ms < 1:
            raise ValueError("pattern_timeout_ms must be >= 1")
        self._db = db
        self._ef_search = ef_search
        self._pattern_timeout_ms = pattern_timeout_ms
        self._schema: SchemaInfo | None = None
        self._vector_registered: weakref.WeakSet[Any] = weakref.WeakSet()
        self._known_collections: dict[str, float] = {}

    # --- schema --------------------------------------------------------------------------

    async def _raw_with_vector(self, conn: AsyncConnection) -> Any:
        """The psycopg connection under ``conn``, with pgvector's types registered once per
        connection (registering looks the type up in the catalog: a round trip each time)."""
        raw = (await conn.get_raw_connection()).driver_connection
        if raw not in self._vector_registered:
            await register_vector_async(raw)
            self._vector_registered.add(raw)
        return raw

    async def collection_exists(self, name: str) -> bool:
        """Whether the collection exists; a yes is remembered for a few seconds (collections are
        created far more rarely than they are searched)."""
        now = time.monotonic()
        if self._known_collections.get(name, 0.0) > now:
            return True
        async with self._db.connect() as conn:
            found = (await conn.execute(select(Collection.id).where(Collection.name == name))).first() is not None
        if found:
            self._known_collections[name] = now + 5.0
        return found

    async def schema(self) -> SchemaInfo:
        """Parameters fixed by the migration (read once): vector dimension, text search config."""
        if self._schema is None:
            async with self._db.connect() as conn:
                try:
                    rows = dict((await conn.execute(text("SELECT key, value FROM schema_info"))).all())
                except ProgrammingError as exc:
                    raise SchemaMismatchError(
                        "the database has no rag-service schema; run `ragsvc db upgrade`"
                    ) from exc
            self._schema = SchemaInfo(
                embedding_dimension=int(rows["embedding_dimension"]),
                text_search_config=rows["text_search_config"],
                has_trgm=rows.get("pg_trgm") == "yes",
            )
        return self._schema

    # --- writes --------------------------------------------------------------------------

    async def upsert_document(self, document: DocumentRecord) -> uuid.UUID:
        async with self._db.begin() as conn:
            return (await self._upsert_documents(conn, [document]))[0]

    async def _upsert_documents(self, conn: AsyncConnection, documents: Sequence[DocumentRecord]) -> list[uuid.UUID]:
        """Insert or update documents by (collection, source_uri) in one statement; their stored ids."""
        collections: dict[str, int] = {}
        for name in dict.fromkeys(d.collection for d in documents):
            collections[name] = await self._ensure_collection(conn, name)
        rows = [
            {
                "id": d.id, "collection_id": collections[d.collection], "source_uri": d.source_uri,
                "title": strip_nul(d.title), "content_hash": d.content_hash, "version": d.version,
                "metadata": strip_nul(d.metadata), "acl": list(d.acl) or [PUBLIC_PRINCIPAL], "lob": d.lob,
                "tags": list(d.tags), "effective_date": d.effective_date,
            }
            for d in documents
        ]
        keys = {(r["collection_id"], r["source_uri"]) for r in rows}
        if len(keys) != len(rows):
            raise InvalidInputError("a batch names the same source_uri twice in one collection")
        table = Document.__table__
        stored: dict[tuple[int, str], uuid.UUID] = {}
        for start in range(0, len(rows), 1000):  # PostgreSQL takes at most 65,535 parameters
            stmt = insert(table).values(rows[start:start + 1000])
            updated = {k: stmt.excluded[k] for k in rows[0] if k not in ("id", "collection_id", "source_uri")}
            stmt = stmt.on_conflict_do_update(
                constraint="uq_documents_collection_source", set_={**updated, "updated_at": func.now()},
            ).returning(table.c.id, table.c.collection_id, table.c.source_uri)
            stored.update({(r.collection_id, r.source_uri): r.id for r in await conn.execute(stmt)})
        return [stored[(r["collection_id"], r["source_uri"])] for r in rows]

    async def _ensure_collection(self, conn: AsyncConnection, name: str) -> int:
        await conn.execute(insert(Collection).values(name=name).on_conflict_do_nothing(index_elements=["name"]))
        return (await conn.execute(select(Collection.id).where(Collection.name == name))).scalar_one()

    async def upsert_chunks(self, chunks: Sequence[ChunkRecord]) -> int:
        if not chunks:
            return 0
        async with self._db.begin() as conn:
            return await self._write_chunks(conn, chunks)

    async def replace_documents(self, items: Sequence[tuple[DocumentRecord, Sequence[ChunkRecord]]]) -> int:
        """Upsert each document and swap its chunks for the given ones, all in one transaction:
        a reader (or a crash) sees every document either entirely old or entirely new."""
        if not items:
            return 0
        async with self._db.begin() as conn:
            stored_ids = await self._upsert_documents(conn, [document for document, _ in items])
            for (document, _), stored_id in zip(items, stored_ids, strict=True):
                if stored_id != document.id:
                    raise InvalidInputError(
                        f"{document.source_uri} is stored as document {stored_id}, not {document.id}; "
                        "replace it under its stored id"
                    )
            await conn.execute(delete(Chunk).where(Chunk.document_id.in_([d.id for d, _ in items])))
            return await self._write_chunks(conn, [chunk for _, chunks in items for chunk in chunks])

    async def _write_chunks(self, conn: AsyncConnection, chunks: Sequence[ChunkRecord]) -> int:
        """Binary COPY into a temp table, then one INSERT ... ON CONFLICT, inside the caller's transaction."""
        if not chunks:
            return 0
        dim = (await self.schema()).embedding_dimension
        latest = {chunk.id: chunk for chunk in chunks}  # one row per id, or ON CONFLICT refuses the batch
        rows = [self._copy_row(chunk, dim) for chunk in latest.values()]
        columns = ", ".join(_CHUNK_COLUMNS)
        updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in _CHUNK_COLUMNS if c != "id")
        raw = await self._raw_with_vector(conn)
        async with raw.cursor() as cur:
            await cur.execute(
                "CREATE TEMP TABLE _chunks_in (LIKE chunks INCLUDING DEFAULTS) ON COMMIT DROP;"
                "ALTER TABLE _chunks_in ALTER COLUMN collection_id DROP NOT NULL"
            )
            async with cur.copy(f"COPY _chunks_in ({columns}) FROM STDIN WITH (FORMAT BINARY)") as copy:
                copy.set_types(list(_CHUNK_TYPES))
                for row in rows:
                    await copy.write_row(row)
            await cur.execute(
                "SELECT count(*) FROM _chunks_in t WHERE NOT EXISTS "
                "(SELECT 1 FROM documents d WHERE d.id = t.document_id)"
            )
            orphans = (await cur.fetchone())[0]
            await cur.execute(
                "SELECT count(*) FROM _chunks_in t WHERE t.parent_id IS NOT NULL "
                "AND NOT EXISTS (SELECT 1 FROM _chunks_in p WHERE p.id = t.parent_id) "
                "AND NOT EXISTS (SELECT 1 FROM chunks p WHERE p.id = t.parent_id)"
            )
            missing_parents = (await cur.fetchone())[0]
            if missing_parents:
                raise InvalidInputError(
                    f"{missing_parents} chunks name a parent_id that is neither in the batch nor stored"
                )
            if orphans:
                # Raising inside the transaction rolls the whole batch back.
                raise InvalidInputError(
                    f"{orphans} of {len(rows)} chunks reference documents that do not exist; "
                    "upsert the documents first"
                )
            await cur.execute(
                f"INSERT INTO chunks ({columns}, collection_id) "
                f"SELECT {', '.join('t.' + c for c in _CHUNK_COLUMNS)}, d.collection_id "
                "FROM _chunks_in t JOIN documents d ON d.id = t.document_id "
                f"ON CONFLICT (id) DO UPDATE SET {updates}, collection_id = EXCLUDED.collection_id"
            )
            written = cur.rowcount
            await cur.execute("DROP TABLE _chunks_in")  # a second call in the same transaction recreates it
            return written

    @staticmethod
    def _copy_row(chunk: ChunkRecord, dim: int) -> tuple[Any, ...]:
        embedding = None
        if chunk.embedding is not None:
            if len(chunk.embedding) != dim:
                raise InvalidInputError(
                    f"chunk {chunk.id} has a {len(chunk.embedding)}-d embedding; the store holds {dim}-d vectors"
                )
            embedding = np.asarray(chunk.embedding, dtype=np.float32)
        return (
            chunk.id, chunk.document_id, chunk.parent_id, chunk.ordinal, strip_nul(chunk.text),
            chunk.start_char, chunk.end_char, chunk.token_count, chunk.content_hash, Jsonb(strip_nul(chunk.metadata)),
            embedding,
        )

    async def delete_document(self, document_id: uuid.UUID) -> bool:
        async with self._db.begin() as conn:
            result = await conn.execute(delete(Document).where(Document.id == document_id))
            return result.rowcount > 0

    # --- searches ------------------------------------------------------------------------

    def _base_select(self, score: ColumnElement[Any]) -> Select[Any]:
        return (
            select(
                Chunk.id, Chunk.document_id, Chunk.parent_id, Chunk.ordinal, Document.source_uri, Document.title,
                Chunk.text, Chunk.start_char, Chunk.end_char, Chunk.metadata_.label("chunk_metadata"),
                score.label("score"),
            )
            .select_from(Chunk)
            .join(Document, Document.id == Chunk.document_id)
        )

    @staticmethod
    def _hits(rows: Sequence[Any]) -> list[SearchHit]:
        return [
            SearchHit(
                chunk_id=r.id, document_id=r.document_id, parent_id=r.parent_id, ordinal=r.ordinal,
                source_uri=r.source_uri, title=r.title, text=r.text, start_char=r.start_char,
                end_char=r.end_char, score=float(r.score), metadata=r.chunk_metadata or {},
            )
            for r in rows
        ]

    def vector_query(self, embedding: Sequence[float], flt: SearchFilter, top_k: int, dim: int) -> Select[Any]:
        """The nearest-neighbour statement (public so its plan can be inspected with EXPLAIN)."""
        _check_top_k(top_k)
        if len(embedding) != dim:
            raise InvalidInputError(f"query embedding has {len(embedding)} dimensions; the store holds {dim}")
        vector = np.asarray(embedding, dtype=np.float32)
        if not np.isfinite(vector).all() or not np.any(vector):
            raise InvalidInputError("query embedding must be finite and not all zeros (cosine is undefined)")
        distance = Chunk.embedding.cosine_distance(vector)
        return (
            self._base_select(1 - distance)
            .where(Chunk.embedding.is_not(None), *build_filter(flt))
            .order_by(distance)
            .limit(top_k)
        )

    async def vector_search(
        self, embedding: Sequence[float], flt: SearchFilter, top_k: int, *, exact: bool = False
    ) -> list[SearchHit]:
        stmt = self.vector_query(embedding, flt, top_k, (await self.schema()).embedding_dimension)
        async with self._db.connect() as conn:
            await conn.execute(text(f"SET LOCAL hnsw.ef_search = {max(self._ef_search, top_k)}"))
            rows = [] if exact else (await conn.execute(stmt)).all()
            if len(rows) < top_k:
                # HNSW applies filters after the index scan, so a selective filter (or ACL) can
                # starve the result. Re-run exactly: ordering by an expression the index cannot
                # serve makes PostgreSQL scan only the rows the other conditions select.
                distance = Chunk.embedding.cosine_distance(np.asarray(embedding, dtype=np.float32))
                rows = (await conn.execute(stmt.order_by(None).order_by(distance + 0))).all()
        return self._hits(rows)

    async def text_search(self, query: str, flt: SearchFilter, top_k: int) -> list[SearchHit]:
        _check_top_k(top_k)
        if not query.strip():
            raise InvalidInputError("text query must not be empty")
        config = cast(literal((await self.schema()).text_search_config), REGCONFIG)
        tsquery = func.websearch_to_tsquery(config, query.replace("\x00", ""))
        rank = func.ts_rank_cd(Chunk.tsv, tsquery)
        stmt = (
            self._base_select(cast(rank, Float))
            .where(Chunk.tsv.op("@@")(tsquery), Chunk.embedding.is_not(None), *build_filter(flt))
            .order_by(rank.desc(), Chunk.id)
            .limit(top_k)
        )
        async with self._db.connect() as conn:
            rows = (await conn.execute(stmt)).all()
        return self._hits(rows)

    async def keyword_search(
        self, query: str, flt: SearchFilter, top_k: int, *, k1: float = 1.2, b: float = 0.75
    ) -> list[SearchHit]:
        _check_top_k(top_k)
        if not query.strip():
            raise InvalidInputError("text query must not be empty")
        if k1 < 0 or not 0 <= b <= 1:
            raise InvalidInputError(f"BM25 needs k1 >= 0 and 0 <= b <= 1, got k1={k1}, b={b}")
        query = query.replace("\x00", "")
        config = (await self.schema()).text_search_config
        scored = self._bm25_scores(query, config, flt.collection, k1, b)
        # Filters are checked on documents for every scored chunk; only the best top_k chunk rows
        # (with their text) are read afterwards.
        best = (
            select(scored.c.chunk_id, scored.c.score)
            .select_from(scored.join(Document, Document.id == scored.c.document_id))
            .where(*build_filter(flt, scope_chunks=False))
            .order_by(scored.c.score.desc(), scored.c.chunk_id)
            .limit(top_k)
        )
        restriction = web_search_restriction(query)
        if restriction:
            # "Phrases" and -exclusions keep their web-search meaning; BM25 orders what they allow.
            # Only those parts restrict: the other words stay optional, as BM25 treats them.
            tsquery = func.websearch_to_tsquery(cast(literal(config), REGCONFIG), restriction)
            best = best.join(Chunk, Chunk.id == scored.c.chunk_id).where(Chunk.tsv.op("@@")(tsquery))
        top = best.subquery("best")
        stmt = (
            self._base_select(top.c.score)
            .join(top, top.c.chunk_id == Chunk.id)
            .order_by(top.c.score.desc(), Chunk.id)
        )
        async with self._db.connect() as conn:
            rows = (await conn.execute(stmt)).all()
        return self._hits(rows)

    @staticmethod
    def _bm25_scores(query: str, config: str, collection: str | None, k1: float, b: float) -> CTE:
        """A CTE (chunk_id, score): Okapi BM25 over the keyword postings, as in Lucene and bm25s:
        idf = ln(1 + (N - df + 0.5) / (df + 0.5)), tf saturated by k1, length-normalised by b.
        The query's terms come from the same text search configuration as the index."""
        # ``collection_id IN (...)`` keeps the postings' primary key usable with or without a
        # collection: (collection, term) is its prefix.
        scope = "SELECT id FROM collections" + (" WHERE name = :collection" if collection is not None else "")
        sql = f"""
            WITH q AS (
                SELECT DISTINCT lexeme AS term FROM unnest(to_tsvector(CAST(:config AS regconfig), :query))
            ), stats AS (
                SELECT greatest(sum(chunk_count), 1)::float8 AS n,
                       greatest(sum(total_length)::float8 / greatest(sum(chunk_count), 1), 1) AS avgdl
                FROM keyword_stats WHERE collection_id IN ({scope})
            ), postings AS (
                SELECT p.term, p.chunk_id, p.document_id, p.tf, p.chunk_length
                FROM keyword_postings p JOIN q ON p.term = q.term WHERE p.collection_id IN ({scope})
            ), df AS (
                SELECT term, count(*)::float8 AS df FROM postings GROUP BY term
            )
            SELECT p.chunk_id, p.document_id,
                   sum(ln(1 + (s.n - df.df + 0.5) / (df.df + 0.5))
                       * p.tf * (:k1 + 1) / (p.tf + :k1 * (1 - :b + :b * p.chunk_length / s.avgdl))) AS score
            FROM postings p JOIN df ON df.term = p.term CROSS JOIN stats s
            GROUP BY p.chunk_id, p.document_id
        """
        params = [
            bindparam("config", config, type_=PG_TEXT), bindparam("query", query, type_=PG_TEXT),
            bindparam("k1", float(k1), type_=Float), bindparam("b", float(b), type_=Float),
        ]
        if collection is not None:
            params.append(bindparam("collection", collection, type_=PG_TEXT))
        stmt = text(sql).bindparams(*params)
        uuid_type = PG_UUID(as_uuid=True)
        return stmt.columns(column("chunk_id", uuid_type), column("document_id", uuid_type),
                            column("score", Float)).cte("bm25")

    async def metadata_search(
        self, flt: SearchFilter, top_k: int, order: RecencyOrder = "newest"
    ) -> list[SearchHit]:
        _check_top_k(top_k)
        if order not in ("newest", "oldest"):
            raise InvalidInputError(f"order must be 'newest' or 'oldest', not {order!r}")
        document_date = func.coalesce(Document.effective_date, Document.updated_at)
        stmt = (
            self._base_select(func.extract("epoch", document_date))
            .where(Chunk.embedding.is_not(None), *build_filter(flt))
            .order_by(document_date.desc() if order == "newest" else document_date.asc(),
                      Chunk.document_id, Chunk.ordinal)
            .limit(top_k)
        )
        async with self._db.connect() as conn:
            rows = (await conn.execute(stmt)).all()
        hits = self._hits(rows)
        # Structured matches carry no relevance: the score is the reciprocal rank in date order.
        return [hit.model_copy(update={"score": 1.0 / rank}) for rank, hit in enumerate(hits, start=1)]

    async def pattern_search(
        self, pattern: str, flt: SearchFilter, top_k: int, mode: PatternMode = "literal",
        case_sensitive: bool = False, prefilter: str | None = None,
    ) -> list[SearchHit]:
        _check_top_k(top_k)
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
        stmt = (
            self._base_select(score)
            .where(*conditions)
            .order_by(score.desc(), Chunk.document_id, Chunk.ordinal)
            .limit(top_k)
        )
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
                # order; the pattern then runs on those few instead of on every chunk.
                stmt = stmt.where(Chunk.tsv.op("@@")(phrase))
            await conn.execute(text(f"SET LOCAL statement_timeout = {int(self._pattern_timeout_ms)}"))
            try:
                rows = (await conn.execute(stmt)).all()
            except DBAPIError as exc:
                if "statement timeout" in str(exc.orig):
                    raise InvalidInputError(
                        f"pattern {pattern!r} took longer than {self._pattern_timeout_ms} ms; "
                        "make it more specific or narrow the filter"
                    ) from exc
                raise
        return self._hits(rows)

    async def chunks_by_id(
        self, chunk_ids: Sequence[uuid.UUID], *, with_embeddings: bool = False
    ) -> dict[uuid.UUID, tuple[SearchHit, np.ndarray | None]]:
        """Stored chunks by id (parents included), each with its embedding when asked. No ACL
        check: callers pass ids that came out of a filtered search (or their parents)."""
        if not chunk_ids:
            return {}
        columns = [Chunk.embedding] if with_embeddings else []
        stmt = self._base_select(literal(0.0, Float)).add_columns(*columns).where(Chunk.id.in_(list(chunk_ids)))
        async with self._db.connect() as conn:
            rows = (await conn.execute(stmt)).all()
        hits = self._hits(rows)
        return {
            hit.chunk_id: (hit, np.asarray(row.embedding, dtype=np.float32) if with_embeddings
                           and row.embedding is not None else None)
            for hit, row in zip(hits, rows, strict=True)
        }

    async def embeddings_by_id(self, chunk_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, np.ndarray]:
        """Stored embeddings by chunk id (chunks without one are absent), read in binary: a
        reranker asks for a couple of hundred per query, and text parsing would dominate."""
        if not chunk_ids:
            return {}
        async with self._db.connect() as conn:
            raw = await self._raw_with_vector(conn)
            async with raw.cursor(binary=True) as cur:
                await cur.execute("SELECT id, embedding FROM chunks WHERE id = ANY(%s) AND embedding IS NOT NULL",
                                  (list(chunk_ids),))
                return {row[0]: row[1].to_numpy() for row in await cur.fetchall()}

    async def explain(self, statement: Select[Any]) -> str:
        """PostgreSQL's plan for a search statement, as EXPLAIN prints it."""
        async with self._db.connect() as conn:
            await conn.execute(text(f"SET LOCAL hnsw.ef_search = {self._ef_search}"))
            return "\n".join(row[0] for row in await conn.execute(Explain(statement)))

    async def searchable_chunks(self, collection: str | None) -> int:
        """Searchable (embedded) chunks in a collection, or in all: one row read, kept by triggers."""
        stmt = text(
            "SELECT coalesce(sum(chunk_count), 0) FROM keyword_stats WHERE collection_id IN "
            "(SELECT id FROM collections" + (" WHERE name = :name)" if collection is not None else ")")
        )
        async with self._db.connect() as conn:
            params = {"name": collection} if collection is not None else {}
            return int((await conn.execute(stmt, params)).scalar_one())

    async def counts(self) -> StoreCounts:
        async with self._db.connect() as conn:
            row = (
                await conn.execute(
                    text(
                        "SELECT (SELECT count(*) FROM collections), (SELECT count(*) FROM documents), "
                        "(SELECT count(*) FROM chunks), (SELECT count(*) FROM chunks WHERE embedding IS NOT NULL)"
                    )
                )
            ).one()
        return StoreCounts(*map(int, row))


