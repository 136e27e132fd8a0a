"""The machine's speed, measured in the same run as the figures beside it (machines here differ
by up to 2.5x): the raw local embedder's chunks per second on 256 fixed SciFact chunks. The scale
benchmarks time it on the first of their seed's real chunks, as the service ingested them
(``calibration``); the others, which build no seed, on 256 windows of exactly 256 model tokens of
SciFact text (``window_calibration``, the same chunks as ``benchmarks.embedding --chunks 256``).
The two sets give different figures: compare a run only with runs of the same benchmark."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from benchmarks.scale_data import Seed

CALIBRATION_CHUNKS = 256


def calibration_texts(the_seed: Seed) -> list[str]:
    """The fixed SciFact chunks every scale benchmark times the raw embedder on."""
    return [c.text for c in the_seed.leaves[:CALIBRATION_CHUNKS]]


def calibration(runtime, texts: list[str]) -> float:  # noqa: ANN001
    """Chunks per second of the runtime's embedder on ``texts``."""
    return chunks_per_s(runtime.embedder, texts)


def chunks_per_s(embedder, texts: list[str]) -> float:  # noqa: ANN001
    """Chunks per second of ``embedder`` on ``texts`` (after a small warm-up batch)."""
    embedder.encode(texts[:8])
    started = time.perf_counter()
    embedder.encode(texts)
    return round(len(texts) / (time.perf_counter() - started), 1)


def window_calibration() -> float:
    """The raw local embedder (ONNX, the default backend) on 256 windows of 256 tokens."""
    from benchmarks.datasets import BENCH_DATA
    from benchmarks.embedding import make_chunks
    from rag_service.providers.embeddings import LocalEmbedder

    return chunks_per_s(LocalEmbedder(cache_dir=BENCH_DATA / "models"), make_chunks(CALIBRATION_CHUNKS))
