"""BM25 keyword search on the pgvector store.

Scores come from the ``keyword_postings`` and ``keyword_stats`` tables (kept by triggers on
``chunks``), so a query reads only the postings of its own terms; filters are checked on
``documents`` and only the best ``top_k`` chunk rows are read in full.

Every posting of every query term is scored, so a common term's cost grows with the collection
(149 ms p95 at 100,000 chunks; docs/scaling.md). A threshold-algorithm top k over impact-ordered
postings was built, tested exact and measured slower here (migration 0011, removed by 0012): common
terms keep near-maximal impacts for thousands of postings, so its bound rarely stops early.
"""

from __future__ import annotations

from sqlalchemy import CTE, Float, bindparam, cast, column, func, literal, select, text
from sqlalchemy.dialects.postgresql import REGCONFIG
from sqlalchemy.dialects.postgresql import TEXT as PG_TEXT
from sqlalchemy.dialects.postgresql import UUID as PG_UUID

from rag_service.db.models import Chunk, Document
from rag_service.domain import SearchFilter, SearchHit
from rag_service.errors import InvalidInputError
from rag_service.stores.pgvector.connection import PgStoreBase
from rag_service.stores.pgvector.filters import build_filter, check_top_k, web_search_restriction
from rag_service.stores.pgvector.search import base_select, to_hits


class PgKeywordSearch(PgStoreBase):
    """``keyword_search``: Okapi BM25 over the keyword postings. (``text_search``, the other half
    of KeywordSearch, reads ``chunks`` like the other searches and lives beside them in search.py.)"""

    async def keyword_search(
        self, query: str, flt: SearchFilter, top_k: int, *, k1: float = 1.2, b: float = 0.75,
    ) -> list[SearchHit]:
        check_top_k(top_k)
        if not query.strip():
            raise InvalidInputError("text query must not be empty")
        if k1 < 0 or not 0 <= b <= 1:
            raise InvalidInputError(f"BM25 needs k1 >= 0 and 0 <= b <= 1, got k1={k1}, b={b}")
        query = query.replace("\x00", "")
        config = (await self.schema()).text_search_config
        restriction = web_search_restriction(query)
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
        if restriction:
            # "Phrases" and -exclusions keep their web-search meaning; BM25 orders what they allow.
            # Only those parts restrict: the other words stay optional, as BM25 treats them.
            tsquery = func.websearch_to_tsquery(cast(literal(config), REGCONFIG), restriction)
            best = best.join(Chunk, Chunk.id == scored.c.chunk_id).where(Chunk.tsv.op("@@")(tsquery))
        top = best.subquery("best")
        stmt = (
            base_select(top.c.score)
            .join(top, top.c.chunk_id == Chunk.id)
            .order_by(top.c.score.desc(), Chunk.id)
        )
        async with self._db.connect() as conn:
            rows = (await conn.execute(stmt)).all()
        return to_hits(rows)

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
