"""The growth table and the log-log plot of p95 against size, from ``benchmarks.scale --json`` output.

    .venv/bin/python -m benchmarks.scale_report RESULTS.jsonl [--plot docs/scale-p95.png]

Prints a Markdown table (one row per size, as measured: nothing is interpolated) and, with --plot,
writes p95 against chunks on log-log axes for semantic, keyword, ``/v1/search`` and ``/v1/query``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

SERIES = (("semantic_p95_ms", "semantic (store, HNSW)"), ("keyword_p95_ms", "keyword BM25 (store)"),
          ("hybrid_p95_ms", "/v1/search (HTTP)"), ("query_p95_ms", "/v1/query, no LLM (HTTP)"))


def rows(path: Path) -> list[dict]:
    return sorted((json.loads(line) for line in path.read_text().splitlines() if line.strip()),
                  key=lambda row: row["chunks"])


def markdown(results: list[dict]) -> str:
    head = ("| chunks | disk | semantic p95 (recall@10) | keyword p95 (common terms) | keyword in SQL p95 | "
            "`/v1/search` p95 | `/v1/query` p95 | `/v1/query`/s at 16 | nDCG@10 | calibration |")
    lines = [head, "|---:" * (head.count("|") - 1) + "|"]
    for r in results:
        engine = r["detail"].get("keyword_engine") or {}
        sql = engine.get("sql", {}).get("p95_ms")
        lines.append(
            f"| {r['chunks']:,} | {r['disk_mb']:,.0f} MB | {r['semantic_p95_ms']} ms ({r['semantic_recall_at_10']}) "
            f"| {r['keyword_p95_ms']} ms ({r['keyword_common_p95_ms']}) | {f'{sql} ms' if sql is not None else 'n/a'} "
            f"| {r['hybrid_p95_ms']} ms | {r['query_p95_ms']} ms | {r['query_qps_16']} | {r['ndcg_at_10']} "
            f"| {r['calibration_chunks_per_s']} chunks/s |")
    return "\n".join(lines)


def curves(results: list[dict]) -> str:
    """HNSW's recall@10 and p95 by ef_search, and semantic top 10 under filters by the share they keep."""
    out = []
    efs = sorted({int(ef) for r in results for ef in r["detail"]["semantic_by_ef_search"]})
    out.append("| chunks | " + " | ".join(f"ef {ef}" for ef in efs) + " |")
    out.append("|---:" + "|---" * len(efs) + "|")
    for r in results:
        by_ef = r["detail"]["semantic_by_ef_search"]
        cells = [f"{by_ef[str(ef)]['recall_at_10']}, {by_ef[str(ef)]['p95_ms']} ms" if str(ef) in by_ef else ""
                 for ef in efs]
        out.append(f"| {r['chunks']:,} | " + " | ".join(cells) + " |")
    filtered = [r for r in results if r["detail"].get("semantic_filtered_by_share")]
    if filtered:
        shares = list(filtered[0]["detail"]["semantic_filtered_by_share"])
        out += ["", "| chunks | " + " | ".join(f"filter keeps {float(s):.1%}" for s in shares) + " |",
                "|---:" + "|---" * len(shares) + "|"]
        for r in filtered:
            by_share = r["detail"]["semantic_filtered_by_share"]
            out.append(f"| {r['chunks']:,} | " + " | ".join(
                f"p95 {by_share[s]['p95_ms']} ms, recall {by_share[s]['recall_at_10']}, full {by_share[s]['filled']}"
                for s in shares) + " |")
    return "\n".join(out)


def plot(results: list[dict], target: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6.4, 4.2))
    sizes = [r["chunks"] for r in results]
    for key, label in SERIES:
        points = [(n, r[key]) for n, r in zip(sizes, results, strict=True) if r.get(key) is not None]
        if points:
            axes.plot(*zip(*points, strict=True), marker="o", label=label)
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel("chunks in the collection")
    axes.set_ylabel("p95 latency (ms)")
    axes.set_title(f"p95 against size ({results[-1]['date'][:10]}, {results[-1]['machine']['cpus']} vCPU)")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(target, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path, help="benchmarks.scale --json output (one JSON object per line)")
    parser.add_argument("--plot", type=Path, help="write the log-log plot here (PNG)")
    args = parser.parse_args()
    results = rows(args.results)
    print(markdown(results))
    print()
    print(curves(results))
    if args.plot:
        plot(results, args.plot)


if __name__ == "__main__":
    main()
