"""Cross-validate a fine-tuned span reader on XQuAD: would a reader's "no answer" score help the
abstention, and its spans the short answers? An experiment (docs/benchmarks.md, "What else was
tried for abstention and short answers"); the service uses nothing from here.

    .venv/bin/python -m benchmarks.train_answerability      # first: saves the examples
    .venv/bin/python -m benchmarks.reader_cv [--freeze 0] [--epochs 3] [--lr 5e-5] [--folds 0,1,2,3,4]

The reader is all-MiniLM-L6-v2 from its wheel with a SQuAD-style start/end head (transformers'
BertForQuestionAnswering; "no answer" is the [CLS] token, as in SQuAD 2.0), fine-tuned with torch on
the training folds' questions: for each, the pipeline's best passage (best sentence and the next) in
both settings, labelled with the answer's first occurrence in it in the full collection and "no
answer" without the paragraph, and its gold sentence and the next. A best passage can come from
another article, a test fold's included (its text only: never a test question or label). The
reader reads the best sentence only (the short answer's sentence), though its labels may lie in
the next one (8% of the answerable passages). ``--freeze k`` keeps the embeddings and the lowest k
layers as the wheel has them. Folds are grouped by article, as train_answerability's are; each
fold's readings are saved (``.bench-data/reader_oof.json``, keyed by the hyperparameters: delete it
when the examples are collected again), so folds can run in processes one after another.

Once every fold is read, it prints: the reader's gap (best span minus "no answer") as a separator
of full-collection and paragraph-removed examples (ROC AUC); the abstention without the paragraph
at three answered rates of the gap alone and of the default and aligned answerability models with
and without it as one more feature (out of fold); and the reader's short answers' exact match at
several coverages (``report``, shared with ``benchmarks.squad_reader``).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import GroupKFold

from benchmarks.answers import normalize
from benchmarks.datasets import BENCH_DATA, xquad_rows
from benchmarks.logistic import fit, probabilities
from benchmarks.train_answerability import ROWS, featurise
from rag_service.domain import Candidate
from rag_service.pipeline.generation.alignment import passage
from rag_service.pipeline.generation.answerability import FEATURES
from rag_service.pipeline.generation.extractive import ExtractiveGenerator
from rag_service.providers.local_onnx import _model_dir
from rag_service.text.sentences import split_sentences

READINGS = BENCH_DATA / "reader_oof.json"
MAX_TOKENS = 160
MAX_ANSWER_TOKENS = 12
BATCH = 16


def items(examples: list[dict], selections: list, indices, gold_passages: dict[str, tuple[str, int, str]],
          train: bool) -> list[tuple[str, str, int | None, str | None, int]]:
    """(question, passage, answer's char offset or None, answer, example index; -1 for an added gold passage)."""
    out, seen = [], set()
    for i in indices:
        e, s = examples[i], selections[i]
        if s is None:
            continue
        found = passage(s.evidence.best_chunk, s.evidence.best_sentence)
        at = next(((found.find(a), a) for a in e["answers"] if e["setting"] == "full" and a in found), (None, None))
        out.append((e["question"], found, at[0], at[1], int(i)))
        if train and e["setting"] == "full" and e["id"] not in seen and e["id"] in gold_passages:
            seen.add(e["id"])
            gold, offset, answer = gold_passages[e["id"]]
            if gold != found:
                out.append((e["question"], gold, offset, answer, -1))
    return out


def gold_passages() -> dict[str, tuple[str, int, str]]:
    """Each question's sentence holding its first answer and the next, with the answer's offset in it."""
    out = {}
    for row in xquad_rows():
        context, at = row["context"], row["answer_starts"][0]
        sentences = split_sentences(context)
        for k, s in enumerate(sentences):
            if s.start <= at < s.end:
                out[row["id"]] = (context[s.start:sentences[min(k + 1, len(sentences) - 1)].end], at - s.start,
                                  row["answers"][0])
                break
    return out


def encode(tokenizer, batch: list[tuple]):  # noqa: ANN001, ANN201 - torch tensors
    import torch

    enc = tokenizer([b[0] for b in batch], [b[1] for b in batch], truncation="only_second", max_length=MAX_TOKENS,
                    padding=True, return_offsets_mapping=True, return_tensors="pt")
    starts, ends = [], []
    for k, (_, _, at, answer, _) in enumerate(batch):
        first = last = 0  # "no answer": the [CLS] token
        if at is not None:
            a0, a1 = at, at + len(answer)
            inside = [t for t, ((s, e), seq) in enumerate(zip(enc["offset_mapping"][k].tolist(), enc.sequence_ids(k),
                                                                strict=True)) if seq == 1 and s < a1 and e > a0]
            if inside:  # else the answer was truncated away: "no answer" in what the reader sees
                first, last = inside[0], inside[-1]
        starts.append(first)
        ends.append(last)
    return enc, torch.tensor(starts), torch.tensor(ends)


def train(tokenizer, data: list[tuple], freeze: int, epochs: int, lr: float):  # noqa: ANN001, ANN201
    import torch
    from transformers import AutoModelForQuestionAnswering

    torch.manual_seed(0)
    model = AutoModelForQuestionAnswering.from_pretrained(str(_model_dir()), local_files_only=True)
    frozen = ("bert.embeddings", *(f"bert.encoder.layer.{k}." for k in range(freeze)))
    for name, parameter in model.named_parameters():
        parameter.requires_grad = not name.startswith(frozen)
    optimiser = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.01)
    schedule = bert_schedule(optimiser, epochs * -(-len(data) // BATCH))
    rng = np.random.default_rng(0)
    model.train()
    for _ in range(epochs):
        order = rng.permutation(len(data))
        for b in range(0, len(data), BATCH):
            train_step(model, tokenizer, [data[j] for j in order[b:b + BATCH]], optimiser, schedule)
    return model.eval()


def bert_schedule(optimiser, steps: int):  # noqa: ANN001, ANN201 - torch objects
    """Linear warm-up over the first 10% of the steps, then linear decay (BERT's schedule)."""
    import torch

    return torch.optim.lr_scheduler.LambdaLR(
        optimiser, lambda s: min(1.0, s / max(1.0, 0.1 * steps)) * max(0.0, (steps - s) / steps))


def train_step(model, tokenizer, batch: list[tuple], optimiser, schedule) -> float:  # noqa: ANN001
    """One optimisation step on ``batch`` (``items``' tuples); the batch's loss."""
    enc, starts, ends = encode(tokenizer, batch)
    loss = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                 token_type_ids=enc["token_type_ids"], start_positions=starts, end_positions=ends).loss
    loss.backward()
    optimiser.step()
    schedule.step()
    optimiser.zero_grad()
    return loss.item()


def selected(examples: list[dict]) -> tuple[list, dict[int, int]]:
    """Each saved example's selection as the service makes it (None: nothing retrieved), and the
    length of its best sentence, the part of the passage a span is read from."""
    generator = ExtractiveGenerator(abstain_below=0.0)
    selections = [generator.select(e["question"], e["sub_questions"],
                                   [Candidate.model_validate(c) for c in e["context"]]) for e in examples]
    return selections, {i: len(s.evidence.best_sentence) if s else 0 for i, s in enumerate(selections)}


def with_unread(readings: dict[int, dict], examples: int) -> dict[int, dict]:
    """``readings`` with "no answer" for the examples that had no passage (nothing retrieved)."""
    return {i: readings.get(i, {"text": "", "gap": -30.0, "probability": 0.0}) for i in range(examples)}


def read(model, tokenizer, data: list[tuple], within: dict[int, int]) -> dict[int, dict]:  # noqa: ANN001
    """Per example: the best span in its best sentence (at most MAX_ANSWER_TOKENS), its gap over
    "no answer" (start + end logits), and its probability (softmax of starts times of ends)."""
    import torch

    out = {}
    with torch.no_grad():
        for b in range(0, len(data), 64):
            batch = data[b:b + 64]
            enc, _, _ = encode(tokenizer, batch)
            logits = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                           token_type_ids=enc["token_type_ids"])
            for k, item in enumerate(batch):
                start, end = logits.start_logits[k].numpy(), logits.end_logits[k].numpy()
                offsets = enc["offset_mapping"][k].tolist()
                tokens = [t for t, seq in enumerate(enc.sequence_ids(k))
                          if seq == 1 and offsets[t][0] < within[item[4]]]
                best, score = (0, 0), -np.inf
                for i in tokens:
                    for j in tokens:
                        if i <= j < i + MAX_ANSWER_TOKENS and start[i] + end[j] > score:
                            best, score = (i, j), float(start[i] + end[j])
                # Padding (not masked by the head) must not take probability from the real tokens.
                real = enc["attention_mask"][k].numpy().astype(bool)
                p_start, p_end = np.exp(start - start.max()) * real, np.exp(end - end.max()) * real
                out[item[4]] = {"text": item[1][offsets[best[0]][0]:offsets[best[1]][1]] if tokens else "",
                                "gap": score - float(start[0] + end[0]) if tokens else -30.0,
                                "probability": float(p_start[best[0]] / p_start.sum() * p_end[best[1]] / p_end.sum())}
    return out


ANSWERED = (0.955, 0.958, 0.96)  # issue 16's 0.95 of all questions is about 0.958 of these (clarifications)


def abstention(scores: np.ndarray, setting: np.ndarray) -> dict[str, float]:
    """Abstention without the paragraph when the threshold answers each ANSWERED share of the
    full-collection examples (the threshold read from the full examples' scores)."""
    full, removed = scores[setting == "full"], scores[setting == "removed"]
    return {str(a): round(float((removed < np.quantile(full, 1 - a)).mean()), 4) for a in ANSWERED}


def out_of_fold(x: np.ndarray, y: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Answerability probabilities, each article's examples scored by a model that never saw it."""
    names = tuple(f"f{k}" for k in range(x.shape[1]))
    oof = np.zeros(len(y))
    for train_idx, test_idx in GroupKFold(n_splits=5).split(x, y, groups):
        oof[test_idx] = probabilities(fit(x[train_idx], y[train_idx], names), x[test_idx])
    return oof


def short_answers(examples: list[dict], readings: dict[int, dict], setting: np.ndarray, key: str) -> dict:
    """Exact match of the reader's spans on the full-collection questions, surest first by ``key``:
    at several coverages, and the largest coverage whose exact match is still >= 0.60."""
    answered = [i for i in range(len(examples)) if setting[i] == "full"]
    exact = np.array([bool(readings[i]["text"]) and normalize(readings[i]["text"]) in
                      {normalize(a) for a in examples[i]["answers"]} for i in answered], dtype=float)
    order = np.argsort([-readings[i][key] for i in answered], kind="stable")
    running = np.cumsum(exact[order]) / np.arange(1, len(order) + 1)
    met = np.nonzero(running >= 0.60)[0]
    return {"exact_match_by_coverage": {str(c): round(float(running[max(1, int(c * len(order))) - 1]), 4)
                                        for c in (0.16, 0.3, 0.4, 0.5, 0.6, 1.0)},
            "largest_coverage_at_em_0.60": round(float((met.max() + 1) / len(order)), 4) if len(met) else 0.0}


def report(examples: list[dict], readings: dict[int, dict], x: np.ndarray, y: np.ndarray, setting: np.ndarray,
           groups: np.ndarray) -> dict:
    """The reader's gap (best span minus "no answer", clipped) as a separator of full-collection and
    paragraph-removed examples; the abstention without the paragraph of the answerability models
    with and without the gap as one more feature (out of fold); the short answers' exact match,
    surest first by the span's probability and by the gap."""
    gap = np.clip([readings[i]["gap"] for i in range(len(examples))], -15, 15)
    both = setting != "article"
    # The models here are measured without the shipped reader's gap, and with this reader's instead.
    x = np.delete(x, FEATURES.index("reader_gap"), axis=1)
    default = x[:, :len(FEATURES) - 1]
    return {"gap_auc_full_vs_removed": round(float(roc_auc_score(setting[both] == "full", gap[both])), 4),
            "abstention_without_paragraph_at_answered": {
                "reader_gap_alone": abstention(gap, setting),
                "default_model": abstention(out_of_fold(default, y, groups), setting),
                "default_model_and_gap": abstention(out_of_fold(np.column_stack([default, gap]), y, groups), setting),
                "aligned_model": abstention(out_of_fold(x, y, groups), setting),
                "aligned_model_and_gap": abstention(out_of_fold(np.column_stack([x, gap]), y, groups), setting)},
            "short_answers_by_probability": short_answers(examples, readings, setting, "probability"),
            "short_answers_by_gap": short_answers(examples, readings, setting, "gap")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--freeze", type=int, default=0, help="embeddings and this many lowest layers stay frozen")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--folds", default="0,1,2,3,4",
                        help="which of the 5 folds to train and read now (none: report on the saved readings)")
    parser.add_argument("--data-dir", type=Path, default=BENCH_DATA / "xquad",
                        help="the data dir train_answerability used")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoTokenizer

    torch.set_num_threads(os.cpu_count() or 1)
    examples = [json.loads(line) for line in ROWS.read_text().splitlines()]
    selections, within = selected(examples)
    x, y, setting, groups = featurise(examples, args.data_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(_model_dir()), local_files_only=True)
    key = f"freeze{args.freeze}-epochs{args.epochs}-lr{args.lr}"
    saved = json.loads(READINGS.read_text()) if READINGS.exists() else {}
    readings = {int(i): r for i, r in saved.get(key, {}).items()}
    golds = gold_passages()
    started = time.perf_counter()
    folds = list(GroupKFold(n_splits=5).split(x, y, groups))
    for fold in (int(f) for f in args.folds.split(",") if f):
        train_idx, test_idx = folds[fold]
        data = items(examples, selections, train_idx, golds, train=True)
        model = train(tokenizer, data, args.freeze, args.epochs, args.lr)
        readings.update(read(model, tokenizer, items(examples, selections, test_idx, golds, train=False), within))
        saved[key] = readings
        READINGS.write_text(json.dumps(saved))
        print(f"fold {fold}: {len(data)} training passages, {time.perf_counter() - started:.0f} s", flush=True)
    missing = [i for i in range(len(examples)) if selections[i] is not None and i not in readings]
    if missing:
        print(f"{len(missing)} examples not read yet: run the other folds")
        return
    readings = with_unread(readings, len(examples))
    print(json.dumps({"reader": key, **report(examples, readings, x, y, setting, groups)}, indent=1))


if __name__ == "__main__":
    main()
