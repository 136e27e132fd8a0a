"""BM25 keyword search on the pgvector store.

Scores come from the ``keyword_postings`` and ``keyword_stats`` tables (kept by triggers on
``chunks``), so a query reads only the postings of its own terms; filters are checked on
``documents`` and only the best ``top_k`` chunk rows are read in full.

Scored in SQL, every posting of every query term counts, so a common term's cost grows with the
collection (149 ms p95 at 100,000 chunks; docs/scaling.md). With the tantivy engine
(``term_index.py``, ``RAGSVC_KEYWORD_ENGINE=tantivy``) a collection's top k comes from tantivy's
block-max WAND instead: its best candidates are rescored here exactly, from the same postings and
statistics as the SQL scoring, and kept only when provably the top k (else more are asked for, and
past ``MAX_DEPTH`` the SQL scoring answers). A threshold-algorithm top k in SQL was built, tested
exact and measured slower (migration 0011, removed by 0012).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Hashable, Sequence

from sqlalchemy import CTE, Float, TextClause, bindparam, cast, column, func, literal, select, text
from sqlalchemy.dialects.postgresql import REGCONFIG
from sqlalchemy.dialects.postgresql import TEXT as PG_TEXT
from sqlalchemy.dialects.postgresql import UUID as PG_UUID

from rag_service.db.models import Chunk, Document
from rag_service.domain import SearchFilter, SearchHit
from rag_service.errors import InvalidInputError
from rag_service.stores.pgvector.connection import PgStoreBase
from rag_service.stores.pgvector.filters import build_filter, check_top_k, web_search_restriction
from rag_service.stores.pgvector.search import base_select, to_hits
from rag_service.stores.pgvector.term_index import K1, B, Candidates, TermIndex

# N and the average length from the statistics' delta rows: one expression for the exhaustive
# scoring and the rescoring, whose results must agree to the last bit.
_STATS = ("greatest(sum(chunk_count), 1)::float8 AS n, "
          "greatest(sum(total_length)::float8 / greatest(sum(chunk_count), 1), 1) AS avgdl")


def _lexemes(text_sql: str) -> str:
    """The distinct lexemes BM25 scores for a text: one expression for the scoring and the
    index's terms."""
    return f"SELECT DISTINCT lexeme FROM unnest(to_tsvector(CAST(:config AS regconfig), {text_sql}))"


MAX_DEPTH = 4096  # candidates asked of tantivy before the SQL scoring takes over
_FLOAT32 = 1e-4   # tantivy scores in float32: its bound is loosened by this much (relative)


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
        # tantivy scores with k1 1.2 and b 0.75: only then are its scores bounds of these.
        index = self._term_index
        if (index is not None and flt.collection is not None and not restriction and (k1, b) == (K1, B)
                and not index.known_small(flt.collection)):
            hits = await self._indexed_keyword_search(query, config, flt, top_k, k1, b)
            if hits is not None:
                return hits
        return await self._top(self._bm25_scores(query, config, flt.collection, k1, b), flt, top_k, config,
                               restriction)

    async def keyword_query_keys(self, texts: Sequence[str]) -> list[Hashable]:
        """Each text's distinct lexemes (what BM25 scores) but for hyphenated compounds, and its
        phrase/exclusion restriction, in one round trip. PostgreSQL's parser gives a hyphenated
        word's parts as lexemes of their own beside the whole ("sex-determining": sex-determin,
        sex, determin), so without the whole a rewrite that only splits the hyphens has the
        question's key: it asks for the same words, less the compound's own weight. Searching it
        again cost 25-40 ms of the adaptive loop at 1,000,000 chunks and changed one SciFact test
        query's nDCG@10 of 300 (docs/benchmarks.md, "Scale"). Tokens that are not hyphenated words
        to the parser ("2-3", "foo-bar.com") keep their lexemes, so their split spellings differ."""
        cleaned = [t.replace("\x00", "") for t in texts]
        config = (await self.schema()).text_search_config
        async with self._db.connect() as conn:
            rows = (await conn.execute(text(
                "SELECT array(SELECT DISTINCT lexeme FROM ts_debug(CAST(:config AS regconfig), x.t) d, "
                "unnest(d.lexemes) lexeme WHERE d.alias NOT IN ('asciihword', 'hword', 'numhword') ORDER BY 1) "
                "FROM unnest(CAST(:texts AS text[])) WITH ORDINALITY AS x(t, i) ORDER BY x.i"),
                {"config": config, "texts": cleaned})).all()
        return [(tuple(r[0]), web_search_restriction(t)) for r, t in zip(rows, cleaned, strict=True)]

    async def _top(self, scored: CTE, flt: SearchFilter, top_k: int, config: str,
                   restriction: str | None) -> list[SearchHit]:
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

    async def _indexed_keyword_search(self, query: str, config: str, flt: SearchFilter, top_k: int,
                                      k1: float, b: float) -> list[SearchHit] | None:
        """The top k from tantivy's candidates, rescored exactly; None when the SQL scoring must
        answer (no index yet, no query terms, or no proof within MAX_DEPTH candidates)."""
        assert self._term_index is not None and flt.collection is not None
        async with self._db.connect() as conn:
            row = (await conn.execute(text(
                f"SELECT k.id, array({_lexemes(':query')} ORDER BY 1), s.n, s.avgdl "
                f"FROM collections k CROSS JOIN LATERAL (SELECT {_STATS} "
                "FROM keyword_stats WHERE collection_id = k.id) s WHERE k.name = :collection"),
                {"config": config, "query": query, "collection": flt.collection})).one_or_none()
        if row is None or not row[1]:
            return None
        collection_id, terms, n, avgdl = row
        if n < self._term_index.min_chunks:
            self._term_index.found_small(flt.collection)
            return None
        index: TermIndex = self._term_index
        entry = await index.current(collection_id)
        if entry is None:
            index.fell_back += 1
            return None
        searcher = entry.index.searcher()  # one view of the index for every round
        depth = first_depth(top_k)
        while True:
            found = await asyncio.to_thread(index.candidates, searcher, terms, depth)
            # The candidates' exact top k, their rows read in the same statement. A later round
            # (rare: the first proves the top k for every SciFact test query) rescores them all.
            best = (await self._top(_exact_scores(found, collection_id, n, avgdl, k1, b), flt, top_k, config, None)
                    if found.chunk_ids else [])
            # A chunk outside the candidates scores at most tantivy's last candidate score (its
            # length is rounded down), loosened by how far tantivy's statistics differ from these.
            # Fewer candidates than asked for: every chunk holding a query term was one.
            every = len(found.chunk_ids) < depth
            if every or (len(best) == top_k and best[-1].score > found.scores[-1] * _slack(found, n, avgdl)):
                index.answered += 1
                index.proven += not every
                return best
            if depth >= MAX_DEPTH:
                index.fell_back += 1
                return None
            depth = min(depth * 4, MAX_DEPTH)

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
                SELECT lexeme AS term FROM ({_lexemes(':query')}) l
            ), stats AS (
                SELECT {_STATS}
                FROM keyword_stats WHERE collection_id IN ({scope})
            ), postings AS (
                SELECT p.term, p.chunk_id, p.document_id, p.tf, p.chunk_length
                FROM keyword_postings p JOIN q ON p.term = q.term WHERE p.collection_id IN ({scope})
            ), df AS (
                SELECT term, count(*)::float8 AS df FROM postings GROUP BY term
            )
            SELECT p.chunk_id, p.document_id,
                   sum({_bm25_term(n="s.n", df="df.df", avgdl="s.avgdl")}) AS score
            FROM postings p JOIN df ON df.term = p.term CROSS JOIN stats s
            GROUP BY p.chunk_id, p.document_id
        """
        params = [
            bindparam("config", config, type_=PG_TEXT), bindparam("query", query, type_=PG_TEXT),
            bindparam("k1", float(k1), type_=Float), bindparam("b", float(b), type_=Float),
        ]
        if collection is not None:
            params.append(bindparam("collection", collection, type_=PG_TEXT))
        return _scored(text(sql).bindparams(*params))


def first_depth(top_k: int) -> int:
    """Candidates asked of tantivy in the first round: half as many again as wanted (ten more at
    least). tantivy's scores are the exact ones but for rounding, so the bound nearly always proves
    the top k from these; a next round asks for four times as many and rescores them all. At
    1,000,000 chunks, top 100 from 150 candidates took 16 ms at p50 against 30 ms from 400 (all
    300 SciFact test queries proven either way; docs/benchmarks.md, "Scale")."""
    return min(max(top_k + top_k // 2, top_k + 10), MAX_DEPTH)


def _exact_scores(found: Candidates, collection_id: int, n: float, avgdl: float, k1: float, b: float) -> CTE:
    """The candidates' BM25 as the CTE (chunk_id, document_id, score) ``_top`` reads, exactly as
    ``_bm25_scores`` computes it (the same N and average length; document frequencies from the
    index)."""
    # One primary-key probe per (term, candidate): LIMIT 1 keeps each a probe (a plain join lets
    # the planner read the terms' whole posting lists and filter them).
    sql = f"""
        WITH q AS (
            SELECT * FROM unnest(CAST(:terms AS text[]), CAST(:dfs AS float8[])) AS q(term, df)
        )
        SELECT p.chunk_id, p.document_id,
               sum({_bm25_term(n=":n", df="q.df", avgdl=":avgdl")}) AS score
        FROM q CROSS JOIN unnest(CAST(:ids AS uuid[])) AS c(chunk_id)
        CROSS JOIN LATERAL (
            SELECT p.chunk_id, p.document_id, p.tf, p.chunk_length FROM keyword_postings p
            WHERE p.collection_id = :collection_id AND p.term = q.term AND p.chunk_id = c.chunk_id LIMIT 1
        ) p
        GROUP BY p.chunk_id, p.document_id
    """
    terms = list(found.doc_freqs)
    stmt = text(sql).bindparams(
        bindparam("terms", terms), bindparam("dfs", [float(found.doc_freqs[t]) for t in terms]),
        bindparam("n", n, type_=Float), bindparam("avgdl", avgdl, type_=Float),
        bindparam("k1", float(k1), type_=Float), bindparam("b", float(b), type_=Float),
        bindparam("collection_id", collection_id), bindparam("ids", list(found.chunk_ids)))
    return _scored(stmt)


def _scored(stmt: TextClause) -> CTE:
    """A scoring statement as the CTE (chunk_id, document_id, score) that ``_top`` reads."""
    uuid_type = PG_UUID(as_uuid=True)
    return stmt.columns(column("chunk_id", uuid_type), column("document_id", uuid_type),
                        column("score", Float)).cte("bm25")


def _bm25_term(*, n: str, df: str, avgdl: str) -> str:
    """One posting's BM25 in SQL, shared by the exhaustive scoring and the rescoring so that both
    compute the same floating-point result: idf = ln(1 + (N - df + 0.5) / (df + 0.5)), tf
    saturated by k1, length-normalised by b (the posting is ``p``)."""
    return (f"ln(1 + ({n} - {df} + 0.5) / ({df} + 0.5)) "
            f"* p.tf * (:k1 + 1) / (p.tf + :k1 * (1 - :b + :b * p.chunk_length / {avgdl}))")


def _idf(n: float, df: float) -> float:
    return math.log(1 + (n - df + 0.5) / (df + 0.5))


def _slack(found: Candidates, n: float, avgdl: float) -> float:
    """How much higher an exact score can be than tantivy's for the same chunk: tantivy's N,
    document frequencies and average length count deleted chunks until their segment merges. A
    term's idf can be higher here by the ratio of the two idfs; a longer average length raises every
    term's length factor by at most its ratio."""
    idf_ratio = max((_idf(n, found.doc_freqs[t]) / _idf(found.total_docs, df)
                     for t, df in found.index_doc_freqs.items() if df and _idf(found.total_docs, df) > 0),
                    default=1.0)
    length_ratio = avgdl / found.avgdl if found.avgdl > 0 else math.inf
    return max(1.0, idf_ratio) * max(1.0, length_ratio) * (1 + _FLOAT32)
