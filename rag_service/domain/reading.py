"""What a span reader makes of a question and a passage: the best span it would answer with, and
how sure it is that the passage answers at all (the provider that reads is in providers/reader.py;
the answerability and short-answer steps only read this)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SpanReading:
    text: str            # the best span, copied from the passage ("" when nothing could be read)
    start: int           # its character offsets in the passage
    end: int
    gap: float           # the span's start + end logits minus "no answer"'s: > 0 reads as answered
    probability: float   # the span's start probability times its end probability
