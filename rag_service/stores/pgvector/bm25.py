"""BM25 keyword search on the pgvector store.

Scores come from the ``keyword_postings``, ``keyword_terms`` and ``keyword_stats`` tables (kept by
triggers on ``chunks``), so a query reads only the postings of its own terms; filters are checked
on ``documents`` and only the best ``top_k`` chunk rows are read in full.

A common term's posting list grows with the collection. The store can avoid reading whole lists
(``keyword_exhaustive_below``): it then reads each term's postings best first (ordered by their
stored impact) to a depth, scores those candidates exactly, and stops when the k-th best score beats
what any unread chunk could reach (Fagin's threshold algorithm); otherwise it reads deeper, and in the
end scores every posting, so the result is always the exhaustive BM25's. It is off by default: on
the collections measured it was slower than scoring every posting (see EXHAUSTIVE_BELOW).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from sqlalchemy import CTE, Float, Select, bindparam, cast, column, func, literal, select, text
from sqlalchemy.dialects.postgresql import ARRAY, DOUBLE_PRECISION, REGCONFIG
from sqlalchemy.dialects.postgresql import TEXT as PG_TEXT
from sqlalchemy.dialects.postgresql import UUID as PG_UUID

from rag_service.db.models import Chunk, Document
from rag_service.domain import SearchFilter, SearchHit
from rag_service.errors import InvalidInputError
from rag_service.stores.pgvector.connection import PgStoreBase
from rag_service.stores.pgvector.filters import build_filter, check_top_k, web_search_restriction
from rag_service.stores.pgvector.search import base_select, to_hits

# The stored impact (migration 0011) is BM25's term-frequency part at these parameters and a
# reference chunk length: tf (k1 + 1) / (tf + k1 (1 - b + b len / IMPACT_LENGTH)).
IMPACT_K1, IMPACT_B, IMPACT_LENGTH = 1.2, 0.75, 128.0
FIRST_DEPTH = 64   # postings read per term in the first round (at least 2 x top_k)
DEPTH_GROWTH = 8   # each further round reads this many times deeper
MAX_ROUNDS = 3     # then every posting is scored
# Off by default (None): measured, the threshold path was slower than scoring every posting. On
# SciFact (9,707 chunks) p95 20 ms against 14; on 100,000 chunks (benchmarks/scale.py) it proved
# 0 of 80 queries from the first 64 postings per term and p95 was 231-248 ms against 149, because
# the common terms' impacts stay near their maximum for thousands of postings, so the bound of
# queries with many such terms stays above the k-th score. Set a posting count to use it above.
EXHAUSTIVE_BELOW: int | None = None

_TERMS = """
    WITH q AS (
        SELECT DISTINCT lexeme AS term FROM unnest(to_tsvector(CAST(:config AS regconfig), :query))
    ), stats AS (
        SELECT greatest(sum(chunk_count), 1)::float8 AS n,
               greatest(sum(total_length)::float8 / greatest(sum(chunk_count), 1), 1) AS avgdl
        FROM keyword_stats WHERE collection_id = :cid
    ), df AS (
        -- Folded frequencies plus the deltas writers appended since (migration 0011).
        SELECT q.term,
               coalesce((SELECT t.df FROM keyword_terms t WHERE t.collection_id = :cid AND t.term = q.term), 0)
               + coalesce((SELECT sum(d.df) FROM keyword_term_deltas d
                           WHERE d.collection_id = :cid AND d.term = q.term), 0) AS df
        FROM q
    )
    SELECT df.term, df.df, ln(1 + (s.n - df.df + 0.5) / (df.df + 0.5)) AS idf, s.avgdl
    FROM df CROSS JOIN stats s WHERE df.df > 0
"""

# The first unread impact of each term: no unread posting of that term scores above it.
_NEXT_IMPACT = """
    SELECT w.term, (SELECT p.impact FROM keyword_postings p WHERE p.collection_id = :cid AND p.term = w.term
                    ORDER BY p.impact DESC OFFSET :depth LIMIT 1) AS impact
    FROM unnest(CAST(:terms AS text[])) AS w(term)
"""

# Every chunk among some term's best ``depth`` postings, scored exactly over all the query's terms.
_CANDIDATES = """
    WITH w AS (
        SELECT * FROM unnest(CAST(:terms AS text[]), CAST(:idfs AS float8[])) AS w(term, idf)
    ), cand AS (
        SELECT DISTINCT b.chunk_id FROM w CROSS JOIN LATERAL (
            SELECT p.chunk_id FROM keyword_postings p WHERE p.collection_id = :cid AND p.term = w.term
            ORDER BY p.impact DESC LIMIT :depth
        ) b
    )
    SELECT p.chunk_id, p.document_id,
           sum(w.idf * p.tf * (:k1 + 1) / (p.tf + :k1 * (1 - :b + :b * p.chunk_length / :avgdl))) AS score
    FROM cand c CROSS JOIN w
    JOIN keyword_postings p ON p.collection_id = :cid AND p.term = w.term AND p.chunk_id = c.chunk_id
    GROUP BY p.chunk_id, p.document_id
"""


def _best_visible(scored: CTE, flt: SearchFilter, top_k: int) -> Select[Any]:
    """The ``top_k`` best of (chunk_id, document_id, score) rows whose documents pass the filter."""
    return (
        select(scored.c.chunk_id, scored.c.score)
        .select_from(scored.join(Document, Document.id == scored.c.document_id))
        .where(*build_filter(flt, scope_chunks=False))
        .order_by(scored.c.score.desc(), scored.c.chunk_id)
        .limit(top_k)
    )


class PgKeywordSearch(PgStoreBase):
    """``keyword_search``: Okapi BM25 over the keyword postings. (``text_search``, the other half
    of KeywordSearch, reads ``chunks`` like the other searches and lives beside them in search.py.)"""

    def __init__(self, *args: Any, keyword_exhaustive_below: int | None = EXHAUSTIVE_BELOW, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._exhaustive_below = keyword_exhaustive_below
        # How searches were answered: "threshold proved" (from the best postings), "threshold read
        # every posting" (the lists were shorter than the depth) or "exhaustive".
        self.keyword_paths: Counter[str] = Counter()

    async def keyword_search(
        self, query: str, flt: SearchFilter, top_k: int, *, k1: float = 1.2, b: float = 0.75,
        exhaustive: bool = False,
    ) -> list[SearchHit]:
        """BM25's top ``top_k``; ``exhaustive`` scores every posting (the reference the threshold
        algorithm is tested against)."""
        check_top_k(top_k)
        if not query.strip():
            raise InvalidInputError("text query must not be empty")
        if k1 < 0 or not 0 <= b <= 1:
            raise InvalidInputError(f"BM25 needs k1 >= 0 and 0 <= b <= 1, got k1={k1}, b={b}")
        query = query.replace("\x00", "")
        config = (await self.schema()).text_search_config
        restriction = web_search_restriction(query)
        threshold = self._exhaustive_below is not None and (k1, b) == (IMPACT_K1, IMPACT_B)
        if threshold and not exhaustive and flt.collection is not None and not restriction:
            async with self._db.connect() as conn:
                # One snapshot for the frequencies, the bounds and the candidates.
                conn = await conn.execution_options(isolation_level="REPEATABLE READ")
                async with conn.begin():
                    hits = await self._threshold_top(conn, query, config, flt, top_k)
            if hits is not None:
                return hits
        self.keyword_paths["exhaustive"] += 1
        scored = self._bm25_scores(query, config, flt.collection, k1, b)
        # Filters are checked on documents for every scored chunk; only the best top_k chunk rows
        # (with their text) are read afterwards.
        best = _best_visible(scored, flt, top_k)
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

    async def _threshold_top(self, conn: Any, query: str, config: str, flt: SearchFilter,
                             top_k: int) -> list[SearchHit] | None:
        """The exhaustive BM25's top ``top_k`` from the terms' best postings (see the module's
        docstring); None when the terms have few postings (scoring them all is cheaper) or the
        rounds end without proof, for the exhaustive path to answer."""
        cid = (await conn.execute(text("SELECT id FROM collections WHERE name = :c"),
                                  {"c": flt.collection})).scalar_one_or_none()
        if cid is None:
            return []
        terms = (await conn.execute(text(_TERMS).bindparams(
            bindparam("config", config, type_=PG_TEXT), bindparam("query", query, type_=PG_TEXT),
            bindparam("cid", cid)))).all()
        if not terms:
            return []
        if sum(int(t.df) for t in terms) < (self._exhaustive_below or 0):
            return None
        names, idfs, avgdl = [t.term for t in terms], [float(t.idf) for t in terms], float(terms[0].avgdl)
        # Stored impacts assume a chunk length of IMPACT_LENGTH; with a longer average the true
        # term score is at most avgdl / IMPACT_LENGTH times the stored one (never more).
        stretch = max(1.0, avgdl / IMPACT_LENGTH)
        depth = max(FIRST_DEPTH, 2 * top_k)
        arrays = [bindparam("terms", names, type_=ARRAY(PG_TEXT)), bindparam("cid", cid)]
        for _ in range(MAX_ROUNDS):
            scored = text(_CANDIDATES).bindparams(
                *arrays, bindparam("idfs", idfs, type_=ARRAY(DOUBLE_PRECISION)), bindparam("depth", depth),
                bindparam("k1", IMPACT_K1, type_=Float), bindparam("b", IMPACT_B, type_=Float),
                bindparam("avgdl", avgdl, type_=Float),
            ).columns(column("chunk_id", PG_UUID(as_uuid=True)), column("document_id", PG_UUID(as_uuid=True)),
                      column("score", Float)).cte("candidates")
            best = _best_visible(scored, flt, top_k).subquery("best")
            rows = (await conn.execute(
                base_select(best.c.score).join(best, best.c.chunk_id == Chunk.id)
                .order_by(best.c.score.desc(), Chunk.id))).all()
            unread = dict((await conn.execute(text(_NEXT_IMPACT).bindparams(*arrays, bindparam("depth", depth)))).all())
            if all(unread.get(name) is None for name in names):
                self.keyword_paths["threshold read every posting"] += 1
                return to_hits(rows)
            ceiling = stretch * sum(idf * (unread.get(name) or 0.0) for name, idf in zip(names, idfs, strict=True))
            # Strictly above, with room for rounding: a tie with an unread chunk could change the order.
            if len(rows) == top_k and float(rows[-1].score) > ceiling * (1 + 1e-9) + 1e-12:
                self.keyword_paths["threshold proved"] += 1
                return to_hits(rows)
            depth *= DEPTH_GROWTH
        return None

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
