"""Short answers from the span reader (pure, apart from loading the threshold once): its best span
in the best sentence, given only when the reader is sure enough and the span is a real answer.

- Sure enough: the span's probability reaches the threshold in ``span_reader.json``, chosen by
  ``benchmarks/squad_reader.py threshold`` on SQuAD v1.1 dev questions about paragraphs XQuAD
  does not use (so the service's own benchmark stays held out): the lowest probability at which
  the short answers given there are still exactly right ``target_exact_match`` of the time.
- A real answer: it holds a content word the question does not already state (never a pronoun, a
  bare stop word or the question's own words), and when the question asks for a kind of fact (a
  number for "how many", a date for "when", a name for "who") it states a new one of that kind.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib.resources import files

from rag_service.domain import SpanReading
from rag_service.text.questions import expected_kind, has_new_fact, is_question
from rag_service.text.terms import terms

THRESHOLD_FILE = "span_reader.json"
# Trimmed from a span's ends (a full stop stays: "U.S." keeps its last dot).
_EDGE_PUNCTUATION = " \t\n,;:\"'"


@dataclass(frozen=True)
class ReaderThreshold:
    probability: float          # a short answer is given at or above this span probability
    target_exact_match: float   # what it was chosen for
    chosen_on: str              # where it was chosen, and what it measured there


@cache
def shipped_threshold() -> ReaderThreshold:
    data = json.loads(files("rag_service.providers.data").joinpath(THRESHOLD_FILE).read_text())
    return ReaderThreshold(probability=float(data["probability"]),
                           target_exact_match=float(data["target_exact_match"]), chosen_on=data["chosen_on"])


def is_answer_span(question: str, span: str) -> bool:
    """Whether ``span`` can stand as a short answer to ``question``: it adds a content term the
    question lacks and, where the question asks for a kind of fact, states a new one of it."""
    if not set(terms(span)) - set(terms(question)):
        return False
    kind = expected_kind(question)
    # The span is cut from a sentence, so its first word does not start one: facts() reads a lone
    # capitalised first word ("Manning") as no name, since a sentence's first capital says nothing.
    return kind is None or has_new_fact(kind, f"and {span}", question)


def reader_short_answer(question: str, reading: SpanReading, threshold: float | None = None) -> str | None:
    """The reader's span as the short answer, or None: below the threshold, not an answer span, or
    not asked as a question. Keywords are read for the reader's gap, but its span is no short answer
    to them: without a question's wording it cannot tell which fact is wanted ("steam engine
    inventor" gave Charles Porter, whom the sentence calls a high-speed engine's inventor), and its
    threshold was chosen on questions (spans.short_answer holds the patterns to the same rule)."""
    limit = shipped_threshold().probability if threshold is None else threshold
    span = reading.text.strip(_EDGE_PUNCTUATION)
    if (reading.probability < limit or not span or not is_question(question)
            or not is_answer_span(question, span)):
        return None
    return span
