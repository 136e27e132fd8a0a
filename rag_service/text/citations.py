"""Citation handling (pure): find [n] markers, split an answer into claims, check each claim
against the chunk it cites."""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence

from rag_service.domain import Claim
from rag_service.text.sentences import split_sentences
from rag_service.text.terms import terms

_MARKER = re.compile(r"\[(\d{1,3})(?:\s*,\s*(\d{1,3}))*\]")
_ALL_NUMBERS = re.compile(r"\d{1,3}")
SUPPORT_THRESHOLD = 0.6


def cited_numbers(text: str) -> list[int]:
    """Every [n] / [n, m] number in order of first appearance."""
    seen: list[int] = []
    for m in _MARKER.finditer(text):
        for n in map(int, _ALL_NUMBERS.findall(m.group(0))):
            if n not in seen:
                seen.append(n)
    return seen


def strip_markers(text: str) -> str:
    return re.sub(r"\s*" + _MARKER.pattern, "", text).strip()


def support(claim: str, source: str) -> float | None:
    """Share of the claim's content terms found in the source (1.0 for a verbatim quote); None
    when the claim has nothing to check ("Yes.", "See below.")."""
    bare = strip_markers(claim)
    if bare and " ".join(bare.split()).lower() in " ".join(source.split()).lower():
        return 1.0
    claim_terms = set(terms(bare))
    if not claim_terms:
        return None
    return len(claim_terms & set(terms(source))) / len(claim_terms)


_LEADING_MARKERS = re.compile(r"^((?:\[\d{1,3}(?:\s*,\s*\d{1,3})*\]\s*)+)")


def _claim_texts(answer: str) -> list[str]:
    """The answer's sentences, each keeping its markers: "Claim. [1] Next." gives the [1] to "Claim."."""
    texts: list[str] = []
    for sentence in split_sentences(answer):
        text = sentence.text
        lead = _LEADING_MARKERS.match(text)
        if lead and texts:
            texts[-1] = f"{texts[-1]} {lead.group(1).strip()}"
            text = text[lead.end():].strip()
        if text:
            texts.append(text)
    return texts


def verify_claims(answer: str, sources: Sequence[str], threshold: float = SUPPORT_THRESHOLD,
                  cited: Collection[int] | None = None) -> list[Claim]:
    """Each sentence of the answer as a claim with the chunks it cites (1-based into ``sources``).
    A claim is verified when every chunk it cites supports it; a cited number outside the
    sources is reported as unresolved (never verified). ``cited``: the numbers the answer is known
    to cite (an extractive answer's), when its text quotes sources whose own bracketed references
    ("[14]") are not citations; other marks are then read as part of the quote."""
    claims: list[Claim] = []
    for text in _claim_texts(answer):
        numbers = [n for n in cited_numbers(text) if cited is None or n in cited]
        if not numbers:
            claims.append(Claim(text=strip_markers(text), citations=[], verified=False, support=None))
            continue
        scores = [support(text, sources[n - 1]) if 1 <= n <= len(sources) else 0.0 for n in numbers]
        judged = [s for s in scores if s is not None]
        # A claim with nothing checkable is reported as such (support None), not as verified.
        claims.append(Claim(text=strip_markers(text), citations=numbers,
                            verified=bool(judged) and len(judged) == len(scores) and all(s >= threshold
                                                                                         for s in judged),
                            support=round(max(judged), 3) if judged else None))
    return claims


def best_span(claim: str, source: str) -> tuple[int, int, str]:
    """The source sentence that shares the most terms with the claim: (start, end, text)."""
    claim_terms = set(terms(strip_markers(claim)))
    sentences = split_sentences(source) or []
    if not sentences:
        return 0, len(source), source
    best = max(sentences, key=lambda s: (len(claim_terms & set(terms(s.text))), -s.start))
    return best.start, best.end, best.text


def drop_citations(text: str, numbers: set[int]) -> str:
    """The text with the given citation numbers removed from every marker ([7] and [1, 7])."""
    def keep(m: re.Match[str]) -> str:
        kept = [n for n in _ALL_NUMBERS.findall(m.group(2)) if int(n) not in numbers]
        return f"{m.group(1)}[{', '.join(kept)}]" if kept else ""

    return " ".join(re.sub(r"(\s*)(" + _MARKER.pattern + ")", keep, text).split())
