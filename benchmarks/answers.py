"""Answer quality and end-to-end speed on XQuAD (English): the query pipeline over HTTP.

    .venv/bin/pip install -e '.[bench]'
    .venv/bin/python -m benchmarks.answers [--data-dir .bench-data/xquad] [--limit N] [--concurrency 16]

The 240 paragraphs are ingested once as documents (collection xquad; source URI p0..p239), then
``ragsvc serve`` runs on the same data dir with the default configuration (no LLM: extractive
answers) and each of the 1,190 questions is POSTed to /v1/query:

- answer quality from an eval run (``ragsvc eval run --mode full`` in process, through
  ``evaluation.runner``, stored and reportable: the run id is printed): SQuAD exact match and token F1
  of ``short_answer`` when the pipeline extracted one, else the answer's first sentence, against the
  best reference; ragas' SemanticSimilarity with the local MiniLM; the seven grades; also exact
  match / F1 on short answers only. The run asks its own collection (the paragraphs, ingested once);
- citation hit rate: the first citation is the paragraph that holds the answer (goal >= 0.90),
  over all questions (an abstention or a clarification counts as a miss);
- answered rate (outcome ``answered``), short-answer rate and exact match / F1 on short answers,
  and the expected calibration error of the confidence (10 equal-width bins; an answer is right
  when its first citation is the answer's paragraph);
- abstention: every question again, one at a time, asked of the collection without its own paragraph
  (``xquad-minus-k``, see datasets.xquad_without_gold): the share answered ``no_answer``; and once
  more, asked of the collection without its whole article (``xquad-minus-articles-g``,
  datasets.xquad_without_article), where the documents hold nothing on its subject. Beside the
  first, the abstention over the questions whose answer's text no remaining paragraph of their
  article holds (for about one question in ten another one does: an answer may then be right);
- latency over HTTP at concurrency 1 (p50/p95 of each request, goal p95 <= 150 ms), and
  throughput at concurrency N (default 16; goal >= 50 queries/s): all questions again, N at a time;
  beside them the machine's calibration before and after (benchmarks.calibration: the raw
  embedder's chunks/s on 256 windows of 256 tokens).

Ends with one JSON line of every figure. ``--outcomes FILE`` also saves each question's outcome in
each setting (and whether its first citation is the paragraph); ``--against FILE`` compares this
run with such a file question by question (exact McNemar test), for side-by-side runs of two codes.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import platform
import time
import unicodedata
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path

import httpx
import numpy as np
from scipy.stats import binomtest

from benchmarks.calibration import window_calibration
from benchmarks.datasets import (
    BENCH_DATA,
    DATA,
    ingest_once,
    open_runtime,
    xquad,
    xquad_rows,
    xquad_without_article,
    xquad_without_gold,
)
from benchmarks.server import ServerFailed, serve
from evaluation.metrics import normalize as normalize  # re-exported: train_answerability uses it
from rag_service.domain import REFERENCE_CORRECTNESS, EvalRunRequest


def log(message: str) -> None:
    print(message, flush=True)


# What counts as the right outcome in each setting of --outcomes: answering where the answer is in
# the collection (and citing its paragraph first), abstaining where it is not.
WANTED = {"answered": ("full", "answered"), "hit_at_1": ("hit", True),
          "abstained_without_paragraph": ("removed", "no_answer"),
          "abstained_without_article": ("article", "no_answer")}


def paired_change(before: list[bool], after: list[bool]) -> dict:
    """How a yes/no result changed question by question between two runs: how many questions
    gained it, how many lost it, and the two-sided exact McNemar p-value (under no change the
    discordant questions split evenly: a binomial test, scipy.stats.binomtest, on them)."""
    if len(before) != len(after):
        raise ValueError(f"the runs differ in length: {len(before)} and {len(after)} questions")
    if not before:
        raise ValueError("no questions to compare")
    gained = sum(1 for b, a in zip(before, after, strict=True) if a and not b)
    lost = sum(1 for b, a in zip(before, after, strict=True) if b and not a)
    p_value = binomtest(gained, gained + lost, 0.5).pvalue if gained + lost else 1.0
    return {"before": round(sum(before) / len(before), 4), "after": round(sum(after) / len(after), 4),
            "gained": gained, "lost": lost, "mcnemar_p": float(p_value)}


def load_outcomes(path: Path, ids: list[str]) -> dict:
    """An --outcomes file, checked before the long run: every setting present, and questions in
    common with this run's in each."""
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path} is not a readable --outcomes file: {exc}") from exc
    for setting, _ in WANTED.values():
        if not isinstance(saved.get(setting), dict):
            raise ValueError(f"{path} has no {setting!r} outcomes: write it with this version's --outcomes")
        if not set(saved[setting]) & set(ids):
            raise ValueError(f"{path} has no question in common with this run in {setting!r} (another --limit?)")
    return saved


def compare_outcomes(before: dict, after: dict) -> dict:
    """``paired_change`` of every WANTED result over the questions both --outcomes files hold."""
    out = {}
    for name, (setting, wanted) in WANTED.items():
        ids = sorted(set(before[setting]) & set(after[setting]))
        out[name] = paired_change([before[setting][q] == wanted for q in ids],
                                  [after[setting][q] == wanted for q in ids])
    return out


def words_of(text: str) -> str:
    """``text`` as lower-case words between single spaces, punctuation (any script's) read as a
    space and articles left out: SQuAD's normalisation, except that "Manning's" keeps "manning"
    and "24-yard" keeps "24" as words of their own. Pure."""
    spaced = "".join(" " if unicodedata.category(ch).startswith("P") else ch for ch in text.lower())
    return " ".join(w for w in spaced.split() if w not in ("a", "an", "the"))


def answer_text_in(answers: Sequence[str], paragraphs: Iterable[str]) -> bool:
    """Whether any reference answer's words appear, in order and as whole words, in one of
    ``paragraphs`` (``words_of`` both). Without its own paragraph a question may still be answered
    by another of its article that holds its answer (or merely the same words, as "two" or "1998"
    often are). Pure."""
    wanted = [f" {words} " for words in map(words_of, answers) if words]
    if not wanted:
        return False
    return any(a in text for text in (f" {words_of(p)} " for p in paragraphs) for a in wanted)


def _outcomes(rows: list[dict], results: list[dict | None]) -> dict[str, str]:
    """Each question's outcome by id ("error" where the request failed)."""
    return {row["id"]: (r or {}).get("outcome", "error") for row, r in zip(rows, results, strict=True)}


def _cites_first(result: dict | None, paragraph: str) -> bool:
    """Whether the answer's first citation is ``paragraph``."""
    citations = (result or {}).get("citations") or []
    return bool(citations) and citations[0].get("source_uri") == paragraph


def expected_calibration_error(probability: np.ndarray, label: np.ndarray, bins: int = 10) -> float:
    """ECE with equal-width bins: sum over bins of (bin share) x |mean label - mean probability|."""
    edges = np.linspace(0.0, 1.0, bins + 1)
    which = np.clip(np.digitize(probability, edges[1:-1]), 0, bins - 1)
    return float(sum((which == b).mean() * abs(label[which == b].mean() - probability[which == b].mean())
                     for b in range(bins) if (which == b).any()))


async def ask_all(base: str, rows: list[dict], concurrency: int,
                  collection: dict[str, str] | None = None) -> tuple[list[dict | None], list[float], float]:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    results: list[dict | None] = [None] * len(rows)
    latencies: list[float] = [0.0] * len(rows)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(rows)):
        queue.put_nowait(i)
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as client:
        async def worker() -> None:
            while not queue.empty():
                i = queue.get_nowait()
                started = time.perf_counter()
                response = await client.post("/v1/query", json={
                    "question": rows[i]["question"],
                    "collection": collection[rows[i]["id"]] if collection else "xquad"})
                latencies[i] = (time.perf_counter() - started) * 1000
                results[i] = response.json() if response.status_code == 200 else {"error": response.text[:300]}

        started = time.perf_counter()
        await asyncio.gather(*[worker() for _ in range(concurrency)])
        wall = time.perf_counter() - started
    return results, latencies, wall


async def answer_quality(data_dir: Path, limit: int | None) -> dict:
    """The answer figures from a stored eval run (mode full) on the XQuAD file."""
    runtime = open_runtime(data_dir)
    try:
        await runtime.warm_up_embedder()
        run = await runtime.eval_runner.create(EvalRunRequest(
            dataset=f"qa:{DATA / 'xquad_en' / 'xquad_en_flat.jsonl'}", mode="full", limit=limit, concurrency=4,
            name="bench-answers"), created_by="benchmarks.answers")
        run = await runtime.eval_runner.execute(run.id)
        results = [r for r in await runtime.eval_runs.results(run.id) if r.error is None]
    finally:
        await runtime.close()

    def mean(name: str, chosen: list) -> float | None:  # noqa: ANN001
        values = [r.metrics[name] for r in chosen if r.metrics.get(name) is not None]
        return round(float(np.mean(values)), 4) if values else None

    short = [r for r in results if r.short_answer]
    seven = ("overall", "faithfulness", "relevance", "correctness", "coverage", "consistency", "freshness",
             "traceability")
    return {"id": str(run.id), "items_done": run.items_done, "exact_match": mean("squad_exact_match", results),
            "token_f1": mean("squad_f1", results), "semantic_similarity": mean("ragas_semantic_similarity", results),
            "short_answer_rate": round(len(short) / len(results), 4) if results else None,
            "exact_match_short_answers_only": mean("squad_exact_match", short),
            "token_f1_short_answers_only": mean("squad_f1", short),
            "correctness_vs_reference": mean(REFERENCE_CORRECTNESS, results),
            "seven_metrics": {name: mean(name, results) for name in seven}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=BENCH_DATA / "xquad")
    parser.add_argument("--limit", type=int, default=None, help="Only the first N questions (smoke test).")
    parser.add_argument("--concurrency", type=int, default=16,
                        help="requests at a time in the throughput pass (every other pass asks one at a time)")
    parser.add_argument("--outcomes", type=Path, help="Save each question's outcome in each setting here (JSON).")
    parser.add_argument("--against", type=Path,
                        help="An --outcomes file of another run: compare with it question by question.")
    args = parser.parse_args()

    dataset = xquad()  # writes the paragraphs as a BEIR corpus under .bench-data
    rows = xquad_rows()
    if args.limit:
        rows = rows[: args.limit]
    try:
        previous = load_outcomes(args.against, [row["id"] for row in rows]) if args.against else None
    except ValueError as exc:
        parser.error(str(exc))  # before the long run, not after it
    paragraph_of = {qid: next(iter(rel)) for qid, rel in dataset.qrels.items()}
    without = xquad_without_gold()
    collection_without = {qid: d.collection for d in without for qid in d.qrels}
    off_topic = xquad_without_article()
    collection_off_topic = {qid: d.collection for d in off_topic for qid in d.qrels}

    # Closed again once ingested: nothing of ours runs while measured.
    report = ingest_once(args.data_dir, *without, *off_topic, dataset)
    log(f"ingest: {report['documents']} in {report['seconds']:.1f} s")
    # The machine's speed before and after the timed requests, beside the latencies (machines here
    # differ by up to 2.5x, and a slow spell shows as a gap between the two).
    calibration = [window_calibration()]
    log(f"calibration: raw embedder {calibration[0]} chunks/s")
    figures: dict = {"benchmark": "answers", "dataset": "xquad-en", "questions": len(rows),
                     "date": datetime.now(UTC).isoformat(timespec="seconds"), "machine": {
                         "platform": platform.platform(), "cpus": os.cpu_count(),
                         "python": platform.python_version()}}
    try:
        with serve(args.data_dir) as base:
            httpx.post(f"{base}/v1/query", json={"question": "warm up", "collection": "xquad"}, timeout=60)
            results, latencies, wall1 = asyncio.run(ask_all(base, rows, 1))
            log(f"concurrency 1: {len(rows)} questions in {wall1:.1f} s")
            _, latencies_n, wall_n = asyncio.run(ask_all(base, rows, args.concurrency))
            log(f"concurrency {args.concurrency}: {len(rows)} questions in {wall_n:.1f} s")
            # The abstention settings are asked one at a time, as the full collection is. Asked N at a
            # time on a small machine, a request can wait past the adaptive loop's time budget, which
            # then cuts its retrieval short: its outcome would follow the load (docs/benchmarks.md).
            removed, _, _ = asyncio.run(ask_all(base, rows, 1, collection_without))
            log(f"without their paragraphs: {len(rows)} questions")
            other_articles, _, _ = asyncio.run(ask_all(base, rows, 1, collection_off_topic))
            log(f"without their articles: {len(rows)} questions")
    except ServerFailed as exc:
        figures["error"] = str(exc)
        log(json.dumps(figures))
        return
    calibration.append(window_calibration())

    errors = [r for r in results if r is None or "error" in r]
    per_question = {"full": _outcomes(rows, results),
                    "hit": {row["id"]: _cites_first(r, paragraph_of[row["id"]])
                            for row, r in zip(rows, results, strict=True)},
                    "removed": _outcomes(rows, removed), "article": _outcomes(rows, other_articles)}
    outcomes = collections.Counter()
    confidences, rights, hits = [], [], []
    generators = collections.Counter()
    for row, result in zip(rows, results, strict=True):
        if result is None or "error" in result:
            continue
        outcomes[result["outcome"]] += 1
        generators[result.get("generator") or "none"] += 1
        hits.append(1.0 if per_question["hit"][row["id"]] else 0.0)
        if result["outcome"] == "answered" and result.get("confidence") is not None:
            confidences.append(result["confidence"])
            rights.append(hits[-1])
    abstained = [outcome == "no_answer" for outcome in per_question["removed"].values()]
    # The abstention figure counts every question as unanswerable without its paragraph; beside it,
    # the share over the questions whose answer's text no remaining paragraph of its article holds.
    remaining: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
    for d in without:
        for line in d.corpus.read_text().splitlines():
            paragraph = json.loads(line)
            remaining[d.collection, paragraph["title"]].append(paragraph["text"])
    absent = []
    for row in rows:
        article = (collection_without[row["id"]], row["title"].replace("_", " "))
        absent.append(not answer_text_in(row["answers"], remaining[article]))
    abstained_absent = [a for a, gone in zip(abstained, absent, strict=True) if gone]
    abstained_off_topic = [outcome == "no_answer" for outcome in per_question["article"].values()]
    run = asyncio.run(answer_quality(args.data_dir, args.limit))
    log(f"eval run {run['id']}: {run['items_done']} items; report: ragsvc eval report {run['id']}")

    def mean(values: list[float]) -> float | None:
        return round(float(np.mean(values)), 4) if values else None

    figures.update({
        "responses": len(rows) - len(errors), "errors": len(errors),
        "answered_rate": round(outcomes["answered"] / len(rows), 4),
        "abstention_rate_without_paragraph": round(sum(abstained) / len(rows), 4),
        "abstention_rate_without_article": round(sum(abstained_off_topic) / len(rows), 4),
        "abstention_rate_without_paragraph_answer_text_absent": round(
            sum(abstained_absent) / len(abstained_absent), 4) if abstained_absent else None,
        "questions_answer_text_absent_without_paragraph": len(abstained_absent),
        "expected_calibration_error": round(expected_calibration_error(np.array(confidences), np.array(rights)), 4)
        if confidences else None, "outcomes": dict(outcomes), "generators": dict(generators),
        "exact_match": run["exact_match"], "token_f1": run["token_f1"],
        "semantic_similarity": run["semantic_similarity"], "short_answer_rate": run["short_answer_rate"],
        "exact_match_short_answers_only": run["exact_match_short_answers_only"],
        "token_f1_short_answers_only": run["token_f1_short_answers_only"], "seven_metrics": run["seven_metrics"],
        "correctness_vs_reference": run["correctness_vs_reference"],
        "eval_run": run["id"], "citation_hit_rate": mean(hits),
        "latency_ms_c1": {"p50": round(float(np.percentile(latencies, 50)), 1),
                          "p95": round(float(np.percentile(latencies, 95)), 1)},
        f"latency_ms_c{args.concurrency}": {"p50": round(float(np.percentile(latencies_n, 50)), 1),
                                                    "p95": round(float(np.percentile(latencies_n, 95)), 1)},
        "throughput_qps_c1": round(len(rows) / wall1, 1),
        f"throughput_qps_c{args.concurrency}": round(len(rows) / wall_n, 1),
        "calibration_chunks_per_s": calibration,
    })
    for key in ("answered_rate", "citation_hit_rate", "short_answer_rate", "exact_match_short_answers_only",
                "token_f1_short_answers_only", "expected_calibration_error", "abstention_rate_without_paragraph",
                "abstention_rate_without_paragraph_answer_text_absent",
                "questions_answer_text_absent_without_paragraph", "abstention_rate_without_article",
                "exact_match", "token_f1", "semantic_similarity", "seven_metrics", "correctness_vs_reference",
                "latency_ms_c1",
                "throughput_qps_c1", f"throughput_qps_c{args.concurrency}", "calibration_chunks_per_s"):
        log(f"{key:28s} {figures[key]}")
    if args.outcomes:
        args.outcomes.write_text(json.dumps(per_question))
    if previous is not None:
        figures["paired_against"] = {"file": str(args.against), **compare_outcomes(previous, per_question)}
        for name, change in figures["paired_against"].items():
            if name != "file":
                log(f"{name:28s} {change}")
    log(json.dumps(figures))


if __name__ == "__main__":
    main()
