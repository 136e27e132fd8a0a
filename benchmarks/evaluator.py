"""How well do the local scorers tell a faithful answer from an unfaithful one?

Labelled pairs are built from a SQuAD-style file (default: ../shared/data/xquad_en): for each
question, the faithful answer is the context sentence that holds the answer span; it is paired with
  - swap-<kind>: the same sentence with its answer replaced by another question's answer of the same
    kind (number, date or name), and
  - unrelated: a sentence from a paragraph of another article.
Each answer cites its context as [1]. For each metric the benchmark reports pairwise accuracy:
the share of pairs where the faithful answer scores above the unfaithful one (a tie counts half;
a metric that could not judge one side counts as a tie).

A swapped answer is as relevant to the question as the original (it answers the same question,
wrongly), so relevance is checked on the unrelated pairs; it is reported on all pairs too.

    python -m benchmarks.evaluator [--data FILE.jsonl] [--limit N] [--similarity] [--json OUT]

``--similarity`` adds the local embedder's question-answer cosine to relevance (as the service
does); ``--pairs FILE`` scores ready-made pairs instead: JSON lines with question, contexts
(strings), faithful, unfaithful and optionally kind.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

from benchmarks.datasets import DATA
from rag_service.domain import METRICS, EvidenceContext
from rag_service.scoring.evidence import ScoringInput
from rag_service.scoring.local import score_metrics
from rag_service.text.facts import facts, tokens
from rag_service.text.sentences import split_sentences

DEFAULT_DATA = DATA / "xquad_en" / "xquad_en_flat.jsonl"
GOALS = {"faithfulness": ("all", 0.95), "correctness": ("all", 0.95), "relevance": ("unrelated", 0.90)}
_YEAR = re.compile(r"^(1[0-9]{3}|20[0-9]{2})s?$")


def answer_kind(answer: str) -> str | None:
    """number, date or name (None for anything else: phrases are not swapped)."""
    found = facts(answer)
    words = tokens(answer)
    if not words or len(words) > 6:
        return None
    if found.dates or (len(words) == 1 and _YEAR.match(words[0])):
        return "date"
    if found.numbers and not found.names:
        return "number"
    if all(w[0].isupper() for w in words if len(w) > 3) and not found.numbers and found.names:
        return "name"
    return None


def build_pairs(rows: list[dict], seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    by_kind: dict[str, list[str]] = defaultdict(list)
    for row in rows:
        kind = answer_kind(row["answers"][0])
        if kind:
            by_kind[kind].append(row["answers"][0])
    sentences_by_title: dict[str, list[str]] = defaultdict(list)
    for context in sorted({(r["title"], r["context"]) for r in rows}):  # sorted: same pairs every run
        sentences_by_title[context[0]].extend(s.text for s in split_sentences(context[1]) if len(s.text.split()) >= 6)
    titles = sorted(sentences_by_title)
    pairs: list[dict] = []
    for row in rows:
        answer, start = row["answers"][0], row["answer_starts"][0]
        sentence = next((s for s in split_sentences(row["context"]) if s.start <= start < s.end), None)
        if sentence is None or answer not in sentence.text:
            continue
        base = {"question": row["question"], "contexts": [row["context"]], "faithful": sentence.text + " [1]"}
        kind = answer_kind(answer)
        if kind:
            choices = [a for a in by_kind[kind] if a.lower() != answer.lower() and a not in sentence.text]
            if choices:
                other = rng.choice(choices)
                at = start - sentence.start
                if sentence.text[at:at + len(answer)] != answer:
                    at = sentence.text.index(answer)
                swapped = sentence.text[:at] + other + sentence.text[at + len(answer):]
                pairs.append({**base, "kind": f"swap-{kind}", "unfaithful": swapped + " [1]"})
        other_title = rng.choice([t for t in titles if t != row["title"]])
        pairs.append({**base, "kind": "unrelated", "unfaithful": rng.choice(sentences_by_title[other_title]) + " [1]"})
    return pairs


def compare(faithful: float | None, unfaithful: float | None) -> float:
    if faithful is None or unfaithful is None or faithful == unfaithful:
        return 0.5
    return 1.0 if faithful > unfaithful else 0.0


async def cosines(questions: list[str], answers: list[str]) -> list[float]:
    from rag_service.config import load_settings
    from rag_service.providers.embeddings import make_embedder

    embedder = make_embedder(load_settings(data_dir=Path(".bench-data")))
    q = await embedder.embed(questions)
    a = await embedder.embed(answers)
    await embedder.close()
    return [float(x @ y) for x, y in zip(q, a, strict=True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="SQuAD-style flat JSON lines")
    parser.add_argument("--pairs", type=Path, help="ready-made labelled pairs (JSON lines)")
    parser.add_argument("--limit", type=int, default=0, help="at most this many questions (0: all)")
    parser.add_argument("--similarity", action="store_true", help="add the embedder's cosine to relevance")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-quotes", action="store_true",
                        help="do not count a word-for-word quote as support: measures the evidence checks alone "
                             "(the faithful answers here are quotes)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    if args.pairs:
        pairs = [json.loads(line) for line in args.pairs.read_text().splitlines() if line.strip()]
        source = str(args.pairs)
    else:
        rows = [json.loads(line) for line in args.data.read_text().splitlines() if line.strip()]
        if args.limit:
            rows = rows[:args.limit]
        pairs = build_pairs(rows, args.seed)
        source = str(args.data)
    print(f"{len(pairs)} labelled pairs from {source}", file=sys.stderr)

    sims: dict[str, float] = {}
    if args.similarity:
        texts = sorted({(p["question"], p[side]) for p in pairs for side in ("faithful", "unfaithful")})
        values = asyncio.run(cosines([q for q, _ in texts], [a for _, a in texts]))
        sims = {f"{q}\x00{a}": v for (q, a), v in zip(texts, values, strict=True)}

    wins: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    unjudged: dict[str, int] = defaultdict(int)
    started = time.perf_counter()
    timings: list[float] = []
    for pair in pairs:
        contexts = [EvidenceContext(text=c) if isinstance(c, str) else EvidenceContext(**c) for c in pair["contexts"]]
        scored = {}
        for side in ("faithful", "unfaithful"):
            t0 = time.perf_counter()
            inp = ScoringInput(question=pair["question"], answer=pair[side], contexts=contexts,
                               similarity=sims.get(f"{pair['question']}\x00{pair[side]}"),
                               quotes_count=not args.no_quotes)
            scored[side] = {s.metric: s.value for s in score_metrics(inp)}
            timings.append((time.perf_counter() - t0) * 1000)
        for metric in METRICS:
            a, b = scored["faithful"][metric], scored["unfaithful"][metric]
            if a is None or b is None:
                unjudged[metric] += 1
            result = compare(a, b)
            wins[metric]["all"].append(result)
            wins[metric][pair.get("kind", "pair")].append(result)
    elapsed = time.perf_counter() - started

    kinds = sorted({k for m in wins.values() for k in m if k != "all"})
    header = ["metric", "all", *kinds, "unjudged"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    report: dict[str, dict[str, float]] = {}
    for metric in METRICS:
        cells = {k: statistics.fmean(v) for k, v in wins[metric].items()}
        report[metric] = cells
        print(f"| {metric} | " + " | ".join(f"{cells[k]:.3f} ({len(wins[metric][k])})" if k in cells else "-"
                                            for k in ["all", *kinds]) + f" | {unjudged[metric]} |")
    timings.sort()
    print(f"\nscoring time per answer: p50 {timings[len(timings) // 2]:.2f} ms, "
          f"p95 {timings[int(len(timings) * 0.95)]:.2f} ms ({elapsed:.1f} s for {len(timings)} answers)")
    failed = []
    for metric, (subset, goal) in GOALS.items():
        got = report[metric].get(subset)
        ok = got is not None and got >= goal
        failed += [] if ok else [metric]
        print(f"goal {metric} on {subset} pairs >= {goal}: {got:.3f} {'met' if ok else 'MISSED'}")
    if args.json:
        args.json.write_text(json.dumps({"pairs": len(pairs), "source": source, "similarity": args.similarity,
                                         "accuracy": report, "unjudged": unjudged}, indent=2))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
