"""Does abstention carry beyond XQuAD's questions? The no-LLM query pipeline, in process, where the
answerability models were not trained (issue 16's held-out check asks real web questions, which are
not in this repository; this is the nearest evidence that is):

    .venv/bin/python -m benchmarks.answers_transfer [--every 1] [--json]

- SciFact's 300 test claims against SciFact's 5,183 abstracts: another domain, and statements
  instead of questions. Every claim has relevant abstracts in the collection, so answering is
  right, and an answer is right when its first citation is one of them;
- the same claims against XQuAD's 240 paragraphs, which hold little on their subject: abstaining
  is right for nearly all (a few of XQuAD's 48 articles are on biology or medicine: Immune system,
  Pharmacy, Oxygen, Chloroplast, Black Death; no claim's abstract is there);
- XQuAD's questions as typed into a search box (lower case, no question mark) against the full
  collection (answering is right; an answer is right when its first citation is the paragraph),
  against the collection without their own paragraph (``xquad-minus-k``: the article's four other
  paragraphs stay, as for the issue's abstention goal; abstaining is right) and against the
  collection without their article (``xquad-minus-articles-g``; abstaining is right);
- the same questions as keywords (``keyword_style``: "points panthers defense surrender"), against
  the full collection and against the collection without their own paragraph.

For each setting: the share of each outcome, hit@1 among the answers, their mean confidence and
the expected calibration error (10 equal-width bins) where an answer can be right. Ends with one
JSON line of the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import platform
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from benchmarks.answers import expected_calibration_error, log
from benchmarks.datasets import (
    BENCH_DATA,
    ingest_once,
    open_runtime,
    scifact,
    xquad,
    xquad_rows,
    xquad_without_article,
    xquad_without_gold,
)
from rag_service.domain import QueryRequest
from rag_service.text.terms import STOP_WORDS

_WORD = re.compile(r"[a-z0-9](?:[a-z0-9'-]*[a-z0-9])?")


@dataclass(frozen=True)
class Ask:
    question: str
    collection: str
    relevant: frozenset[str]  # source URIs whose citation makes an answer right; empty: abstain


def web_style(question: str) -> str:
    """A question as typed into a search box: lower case, without the question mark."""
    return question.strip().rstrip("?").strip().lower()


def keyword_style(question: str) -> str:
    """A question as keywords typed into a search box: its words in lower case and in order, without
    the question words, auxiliaries and other stop words, and without "name" ("Name the ..." asks as
    "what is" does) ("How many points did the Panthers defense surrender?" -> "points panthers
    defense surrender")."""
    return " ".join(w for w in _WORD.findall(question.lower()) if w not in STOP_WORDS and w != "name")


async def ask_all(data_dir: Path, asks: list[Ask]) -> list[dict]:
    runtime = open_runtime(data_dir, eval_llm_judge=False, eval_ragas=False)
    out = []
    try:
        pipeline = runtime.pipeline
        for ask in asks:
            result = await pipeline.run(QueryRequest(question=ask.question, collection=ask.collection))
            first = result.citations[0].source_uri if result.citations else None
            out.append({"outcome": result.outcome, "right": first in ask.relevant, "confidence": result.confidence})
    finally:
        await runtime.close()
    return out


def summarise(results: list[dict], answerable: bool) -> dict:
    n = len(results)
    if not n:
        return {"questions": 0}
    shares = collections.Counter(r["outcome"] for r in results)
    answers = [r for r in results if r["outcome"] == "answered"]
    out: dict = {"questions": n, **{k: round(v / n, 3) for k, v in sorted(shares.items())}}
    if answers:
        confidence = np.array([r["confidence"] or 0.0 for r in answers])
        out["mean_confidence_of_answers"] = round(float(confidence.mean()), 3)
        if answerable:
            right = np.array([r["right"] for r in answers], dtype=float)
            out["hit_at_1_of_answers"] = round(float(right.mean()), 3)
            out["ece"] = round(expected_calibration_error(confidence, right), 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--every", type=int, default=1, help="ask every n-th XQuAD question (default: all 1,190)")
    parser.add_argument("--scifact-dir", type=Path, default=BENCH_DATA / "scifact")
    parser.add_argument("--xquad-dir", type=Path, default=BENCH_DATA / "xquad")
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    args = parser.parse_args()
    if args.every < 1:
        parser.error("--every must be >= 1")

    claims = scifact("test")
    full, off_topic, siblings = xquad(), xquad_without_article(), xquad_without_gold()
    ingest_once(args.scifact_dir, claims)
    ingest_once(args.xquad_dir, full, *siblings, *off_topic)
    paragraph_removed = {qid: d.collection for d in siblings for qid in d.qrels}
    article_removed = {qid: d.collection for d in off_topic for qid in d.qrels}
    rows = xquad_rows()[:: args.every]
    settings = {
        "scifact_claims_on_scifact": (args.scifact_dir, True, [
            Ask(text, claims.collection, frozenset(claims.qrels[qid])) for qid, text in claims.queries.items()
            if qid in claims.qrels]),
        "scifact_claims_on_xquad": (args.xquad_dir, False, [
            Ask(text, full.collection, frozenset()) for qid, text in claims.queries.items() if qid in claims.qrels]),
        "xquad_web_style_full": (args.xquad_dir, True, [
            Ask(web_style(r["question"]), full.collection, frozenset(full.qrels[r["id"]])) for r in rows]),
        "xquad_web_style_paragraph_removed": (args.xquad_dir, False, [
            Ask(web_style(r["question"]), paragraph_removed[r["id"]], frozenset()) for r in rows]),
        "xquad_web_style_article_removed": (args.xquad_dir, False, [
            Ask(web_style(r["question"]), article_removed[r["id"]], frozenset()) for r in rows]),
        "xquad_keywords_full": (args.xquad_dir, True, [
            Ask(keyword_style(r["question"]), full.collection, frozenset(full.qrels[r["id"]])) for r in rows]),
        "xquad_keywords_paragraph_removed": (args.xquad_dir, False, [
            Ask(keyword_style(r["question"]), paragraph_removed[r["id"]], frozenset()) for r in rows]),
    }
    figures = {}
    for name, (data_dir, answerable, asks) in settings.items():
        log(f"{name}: {len(asks)} questions")
        figures[name] = summarise(asyncio.run(ask_all(data_dir, asks)), answerable)
        if not args.json:
            print(name, json.dumps(figures[name]))
    print(json.dumps({"benchmark": "answers_transfer", "date": datetime.now(UTC).isoformat(timespec="seconds"),
                      "machine": platform.machine(), "python": platform.python_version(), **figures}))


if __name__ == "__main__":
    main()
