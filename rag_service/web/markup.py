"""Review material as safe HTML (pure): an answer's [n] markers as links to the passages, and the
cited spans of a passage marked. Everything is escaped first; only the links and marks are ours."""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable

from markupsafe import Markup, escape

_MARKER = re.compile(r"\[(\d{1,4})\]")


def linked_answer(answer: str, passages: Collection[int]) -> Markup:
    """The answer with each ``[n]`` of a passage that was read turned into a link to ``#chunk-n``."""

    def link(match: re.Match[str]) -> str:
        n = int(match.group(1))
        if n not in passages:
            return match.group(0)
        return f'<a href="#chunk-{n}" class="cite" aria-label="citation {n}">[{n}]</a>'

    # Escaping leaves brackets and digits alone, so markers are found in the escaped text.
    return Markup(_MARKER.sub(link, str(escape(answer))))


def spans(text: str, quotes: Iterable[str]) -> list[tuple[int, int]]:
    """Where each quote first occurs in the text, in order, overlaps dropped; quotes not found are
    left out (the passage may have changed since it was cited)."""
    found = sorted((start, start + len(q)) for q in {q for q in quotes if q} if (start := text.find(q)) >= 0)
    kept: list[tuple[int, int]] = []
    for start, end in found:
        if not kept or start >= kept[-1][1]:
            kept.append((start, end))
    return kept


def highlighted(text: str, quotes: Iterable[str]) -> Markup:
    """The passage with its cited spans in ``<mark>``."""
    parts, at = [], 0
    for start, end in spans(text, quotes):
        parts += [escape(text[at:start]), Markup("<mark>"), escape(text[start:end]), Markup("</mark>")]
        at = end
    parts.append(escape(text[at:]))
    return Markup("").join(parts)
