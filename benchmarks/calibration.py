"""The machine's speed, measured in the same run as the figures beside it (machines here differ
by up to 2.5x): the raw local embedder's chunks per second on the scale benchmarks' 256 fixed
SciFact chunks (the first of the seed's real chunks, as the service ingested them)."""

from __future__ import annotations

import time

from benchmarks.scale_data import Seed

CALIBRATION_CHUNKS = 256


def calibration_texts(the_seed: Seed) -> list[str]:
    """The fixed SciFact chunks every scale benchmark times the raw embedder on."""
    return [c.text for c in the_seed.leaves[:CALIBRATION_CHUNKS]]


def calibration(runtime, texts: list[str]) -> float:  # noqa: ANN001
    """Chunks per second of the runtime's embedder on ``texts`` (after a small warm-up batch)."""
    runtime.embedder.encode(texts[:8])
    started = time.perf_counter()
    runtime.embedder.encode(texts)
    return round(len(texts) / (time.perf_counter() - started), 1)
