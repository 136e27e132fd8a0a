"""Sentence splitting with offsets and the light normalisation answer scoring uses (pure)."""

from __future__ import annotations

import re
from dataclasses import dataclass


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
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9'-]*")
_STOP = _words(
    "a an the of in on at to for from by with about as into over under between and or but not no nor is are was "
    "were be been being do does did have has had this that these those it its there their they them what which "
    "who whom whose when where why how can could should would will shall may might must i you we he she his her "
    "our your my me us than then so such also very just only any some all each other more most many much"
)


@dataclass(frozen=True)
class Sentence:
    text: str
    start: int  # offset in the source text
    end: int


def split_sentences(text: str) -> list[Sentence]:
    """Sentences with their offsets; abbreviations ("Dr.", "e.g.") and decimals do not split."""
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
    return sentences


def _append(out: list[Sentence], text: str, start: int, end: int) -> None:
    piece = text[start:end]
    stripped = piece.strip()
    if len(stripped) < 2 or _TABLE_RULE.match(stripped):
        return
    lead = len(piece) - len(piece.lstrip())
    out.append(Sentence(stripped, start + lead, start + lead + len(stripped)))


def stem(word: str) -> str:
    """A light suffix stripper: enough to match "kneading" with "knead" and "limits" with "limit"."""
    w = word.lower().strip("'")
    for suffix in ("ations", "ation", "ings", "ing", "edly", "ies", "ied", "ed", "es", "ly", "s"):
        if w.endswith(suffix) and len(w) - len(suffix) >= 3:
            w = w[: -len(suffix)]
            if suffix in ("ies", "ied"):
                w += "y"
            break
    return w


def terms(text: str) -> list[str]:
    """Content terms (stop words dropped, stemmed), in order."""
    return [stem(w) for w in _WORD.findall(text) if w.lower() not in _STOP]


def tokens(text: str) -> list[str]:
    """SQuAD-style answer tokens: lowercase words, punctuation and articles dropped."""
    return [w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in ("a", "an", "the")]
