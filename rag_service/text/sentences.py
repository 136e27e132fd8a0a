"""Sentence splitting with character offsets (pure): what answers quote and cite."""

from __future__ import annotations

import re
from dataclasses import dataclass

from rag_service.text.terms import cache_short_texts


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_ABBREVIATIONS = _words(
    "mr mrs ms dr prof sr jr st vs etc e.g i.e al fig no vol approx inc ltd co corp jan feb mar apr jun jul aug "
    "sep sept oct nov dec u.s u.k"
)
# Sentence ends; blank lines; and in Markdown, each list item, heading and table row on its own.
_BOUNDARY = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])|\n{2,}|\n(?=\s*(?:[-*#]|\d+\.)\s)"
                       r"|\n(?=\s*\|)|(?<=\|)[ \t]*\n")
_TABLE_RULE = re.compile(r"^\|?[\s:|-]+\|?$")  # |---|:--:| lines carry no text


@dataclass(frozen=True)
class Sentence:
    text: str
    start: int  # offset in the source text
    end: int


def split_sentences(text: str) -> list[Sentence]:
    """Sentences with their offsets; abbreviations ("Dr.", "e.g.") and decimals do not split (a list
    of one's own: the cache keeps its tuple)."""
    return list(_split(text))


# A collection's hot chunks are split again for every answer that reads them (0.6 ms of an answer
# on XQuAD); a chunk's sentences never change, so they are kept. Not a text with more than 64 places
# a sentence may end ("A. B. C. ..." would make hundreds of them): about 15 KB an entry at most,
# 5 KB for a usual chunk.
@cache_short_texts(maxsize=4096, keep=lambda text: sum(map(text.count, ".!?\n")) <= 64)
def _split(text: str) -> tuple[Sentence, ...]:
    sentences: list[Sentence] = []
    start = 0
    for m in _BOUNDARY.finditer(text):
        before = text[start:m.start()].rstrip()
        last_word = re.findall(r"([A-Za-z.]+)\.$", before)
        if last_word and last_word[0].lower().rstrip(".") in _ABBREVIATIONS:
            continue
        _append(sentences, text, start, m.start())
        start = m.end()
    _append(sentences, text, start, len(text))
    return tuple(sentences)


def _append(out: list[Sentence], text: str, start: int, end: int) -> None:
    piece = text[start:end]
    stripped = piece.strip()
    if len(stripped) < 2 or _TABLE_RULE.match(stripped):
        return
    lead = len(piece) - len(piece.lstrip())
    out.append(Sentence(stripped, start + lead, start + lead + len(stripped)))
