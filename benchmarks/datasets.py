"""Benchmark data from ../shared/data, loaded once per run, and a persistent ingested copy.

SciFact (BEIR) is the tuning and test set for retrieval; XQuAD (English) is held out from
retrieval tuning. The answerability model (abstention and confidence) is the one thing trained on
XQuAD, by article-grouped cross-validation (benchmarks/train_answerability.py).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import text

from ingestion.pipeline import IngestOptions
from rag_service.config import load_settings
from rag_service.runtime import Runtime

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
BENCH_DATA = Path(__file__).resolve().parents[1] / ".bench-data"


@dataclass
class RetrievalSet:
    name: str
    collection: str
    queries: dict[str, str]        # query id -> text
    qrels: dict[str, dict[str, int]]  # query id -> {source_uri: relevance}
    corpus: Path                   # BEIR-style .jsonl the service ingests


def _lines(path: Path) -> list[str]:
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def scifact(split: str) -> RetrievalSet:
    root = DATA / "scifact"
    rows = [json.loads(line) for line in _lines(root / "queries.jsonl")]
    queries = {row["_id"]: row["text"] for row in rows}
    qrels: dict[str, dict[str, int]] = {}
    for line in _lines(root / "qrels" / f"{split}.tsv")[1:]:
        qid, doc, score = line.split("\t")
        qrels.setdefault(qid, {})[doc] = int(score)
    return RetrievalSet(f"scifact-{split}", "scifact", {q: queries[q] for q in qrels}, qrels, root / "corpus.jsonl")


def xquad_rows() -> list[dict]:
    """The 1,190 XQuAD (en) questions as the flat file has them: id, title, context, question,
    answers, answer_starts."""
    return [json.loads(line) for line in _lines(DATA / "xquad_en" / "xquad_en_flat.jsonl")]


def xquad() -> RetrievalSet:
    """XQuAD (en) as retrieval: each question's relevant document is its paragraph. The 240
    paragraphs are written once as a BEIR corpus under .bench-data (ids p0..p239)."""
    rows = xquad_rows()
    paragraphs: dict[str, str] = {}
    titles: dict[str, str] = {}
    for row in rows:
        pid = paragraphs.setdefault(row["context"], f"p{len(paragraphs)}")
        titles[pid] = row["title"].replace("_", " ")
    corpus = BENCH_DATA / "xquad_corpus.jsonl"
    corpus.parent.mkdir(parents=True, exist_ok=True)
    corpus.write_text("".join(json.dumps({"_id": pid, "title": titles[pid], "text": context}) + "\n"
                              for context, pid in paragraphs.items()))
    queries = {row["id"]: row["question"] for row in rows}
    qrels = {row["id"]: {paragraphs[row["context"]]: 1} for row in rows}
    return RetrievalSet("xquad-en", "xquad", queries, qrels, corpus)


XQUAD_FOLDS = 5  # every XQuAD article has five paragraphs
ARTICLE_FOLDS = 5  # collections without a fifth of the articles each (xquad_without_article)


def xquad_without_gold() -> list[RetrievalSet]:
    """XQuAD with each question's own paragraph removed, as five collections: ``xquad-minus-k``
    holds every paragraph except the k-th of each article (each article keeps its four others, as
    it would with only the one paragraph removed). A question on an article's k-th paragraph is
    asked of ``xquad-minus-k``; its qrels name the removed paragraph."""
    full = xquad()
    rows = [json.loads(line) for line in _lines(full.corpus)]
    position: dict[str, int] = {}
    seen: dict[str, int] = {}
    for row in rows:
        position[row["_id"]] = seen.get(row["title"], 0)
        seen[row["title"]] = position[row["_id"]] + 1
    return _without_folds(full, rows, position, XQUAD_FOLDS, "minus")


def xquad_without_article() -> list[RetrievalSet]:
    """XQuAD with each question's whole article removed, as five collections:
    ``xquad-minus-articles-g`` holds every article but the g-th fifth (articles in title order,
    every fifth one). A question is asked of the collection without its article: the documents
    hold nothing on its subject, only other articles that may share its words (the "questions
    paired with other articles" of issue 16). Its qrels name its own paragraph, which is absent."""
    full = xquad()
    rows = [json.loads(line) for line in _lines(full.corpus)]
    fold_of_title = {title: i % ARTICLE_FOLDS for i, title in enumerate(sorted({row["title"] for row in rows}))}
    fold = {row["_id"]: fold_of_title[row["title"]] for row in rows}
    return _without_folds(full, rows, fold, ARTICLE_FOLDS, "minus-articles")


def _without_folds(full: RetrievalSet, rows: list[dict], fold: dict[str, int], folds: int,
                   label: str) -> list[RetrievalSet]:
    """One collection per fold g, ``xquad-{label}-g``, holding every paragraph outside fold g; a
    question is asked of the one without its paragraph's fold (written under .bench-data)."""
    sets = []
    for g in range(folds):
        corpus = BENCH_DATA / f"xquad_corpus_{label.replace('-', '_')}_{g}.jsonl"
        corpus.write_text("".join(json.dumps(row) + "\n" for row in rows if fold[row["_id"]] != g))
        asked = {q: rel for q, rel in full.qrels.items() if fold[next(iter(rel))] == g}
        sets.append(RetrievalSet(f"xquad-en-{label}-{g}", f"xquad-{label}-{g}",
                                 {q: full.queries[q] for q in asked}, asked, corpus))
    return sets


def open_runtime(data_dir: Path, **overrides: object) -> Runtime:
    """A Runtime on a persistent benchmark data dir (or RAGSVC_DATABASE_URL when set)."""
    return Runtime.open(load_settings(data_dir=data_dir, **overrides))


async def ensure_ingested(runtime: Runtime, dataset: RetrievalSet) -> dict:
    """Ingest the corpus (a no-op when unchanged: documents are skipped by hash), then VACUUM
    ANALYZE so the planner has statistics, as autovacuum would give a long-running server."""
    report = await runtime.ingestor().ingest_paths(
        [dataset.corpus], IngestOptions(collection=dataset.collection, format="beir")
    )
    async with runtime.db.engine.connect() as conn:
        conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
        await conn.execute(text("VACUUM ANALYZE"))
    return report.as_dict()


def run_async(coro):  # noqa: ANN001, ANN201
    return asyncio.run(coro)


def ingest_once(data_dir: Path, *datasets: RetrievalSet) -> dict:
    """Ingest the datasets' corpora into ``data_dir`` (unchanged documents are skipped) with a runtime
    closed again before anything is measured; the last dataset's ingestion report."""
    async def prepare() -> dict:
        runtime = open_runtime(data_dir)
        try:
            report: dict = {}
            for dataset in datasets:
                report = await ensure_ingested(runtime, dataset)
            return report
        finally:
            await runtime.close()

    return asyncio.run(prepare())
