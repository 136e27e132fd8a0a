"""Train the local reranker's linear model on SciFact's *train* split and write its weights.

    .venv/bin/pip install -e '.[bench]'
    .venv/bin/python -m benchmarks.train_local_ranker [--data-dir .bench-data/scifact]

For each of the 809 train queries the service retrieves and fuses as it does at query time
(reranker off, adaptive loop off); each of the top ``rerank_top_n`` fused candidates becomes a
row of ``ranker_features`` labelled 1 when its document is judged relevant. A logistic
regression (scikit-learn) is fitted on standardised features and saved to
``rag_service/providers/data/local_ranker.json``. The test split and XQuAD are never read here.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from sklearn.linear_model import LogisticRegression

from benchmarks.datasets import BENCH_DATA, ensure_ingested, open_runtime, run_async, scifact
from rag_service.domain import RetrievalRequest, SearchFilter
from rag_service.providers.rerankers import FEATURES, LinearModel, candidate_cosines, ranker_features

OUTPUT = Path(__file__).resolve().parents[1] / "rag_service" / "providers" / "data" / "local_ranker.json"


async def collect(data_dir: Path) -> tuple[np.ndarray, np.ndarray, int]:
    dataset = scifact("train")
    runtime = open_runtime(data_dir, reranker="none")
    try:
        await runtime.warm_up_embedder()
        print("ingest:", await ensure_ingested(runtime, dataset), flush=True)
        retriever = runtime.retriever
        top_n = runtime.settings.rerank_top_n
        rows, labels = [], []
        for qid, query in dataset.queries.items():
            fused, _, _, embedding = await retriever.fused_candidates(RetrievalRequest(
                query=query, filter=SearchFilter(collection=dataset.collection), adaptive=False,
            ))
            candidates = fused[:top_n]
            rows.append(ranker_features(candidates, await candidate_cosines(runtime.store, candidates, embedding)))
            labels.extend(1 if c.hit.source_uri in dataset.qrels[qid] else 0 for c in candidates)
        return np.vstack(rows), np.array(labels), len(dataset.queries)
    finally:
        await runtime.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=BENCH_DATA / "scifact")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args()
    x, y, n_queries = run_async(collect(args.data_dir))
    mean, scale = x.mean(axis=0), x.std(axis=0)
    scale[scale == 0] = 1.0
    model = LogisticRegression(C=1.0, max_iter=1000, class_weight="balanced").fit((x - mean) / scale, y)
    linear = LinearModel(FEATURES, mean, scale, model.coef_[0], float(model.intercept_[0]),
                         trained_on=f"SciFact train split: {n_queries} queries, {len(y)} candidates, "
                                    f"{int(y.sum())} relevant; scikit-learn LogisticRegression")
    args.output.write_text(json.dumps(linear.dump(), indent=1) + "\n")
    print(json.dumps({"features": FEATURES, "weights": [round(w, 4) for w in linear.weights],
                      "rows": len(y), "positives": int(y.sum()), "output": str(args.output)}))


if __name__ == "__main__":
    main()
