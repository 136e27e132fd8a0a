"""What every scorer reads (pure): the question, the answer split into claims, and the contexts split
into sentences, each with its content terms and checkable facts, computed once per evaluation.

Alignment is the shared step: a claim is compared with the context sentence that shares most of
its terms, together with that sentence's neighbours (a claim often joins two adjacent sentences).
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property

from rag_service.domain import Claim, EvidenceContext
from rag_service.text.citations import cited_numbers, strip_markers, verify_claims
from rag_service.text.facts import FactCheck, Facts, compare, facts, tokens
from rag_service.text.sentences import split_sentences
from rag_service.text.terms import STOP_WORDS, cache_short_texts, stem

LOCAL_SCORER = "local-v1"


# About 1.6 KB an entry (measured under load): 16,384 entries hold at most ~26 MB; 65,536 would have
# let a long-running server grow by ~100 MB as it met new sentences. SciFact's load used under 4,000.
@cache_short_texts(maxsize=16_384)
def content_terms(text: str) -> frozenset[str]:
    """Stemmed content words and numbers of any script (stop words dropped)."""
    return frozenset(stem(w) for w in tokens(text) if w.lower() not in STOP_WORDS)


def normalise(text: str) -> str:
    return " ".join(tokens(text)).lower()


@dataclass(frozen=True)
class Passage:
    """A sentence of a context, or a whole answer sentence."""

    text: str
    context: int  # 0-based index of its context; -1 for answer sentences
    index: int  # position among its context's sentences

    @cached_property
    def terms(self) -> frozenset[str]:
        return content_terms(self.text)

    @cached_property
    def facts(self) -> Facts:
        return facts(self.text)


@dataclass(frozen=True)
class Alignment:
    """A claim's best evidence: the sentence sharing most of its terms, and the window around it."""

    sentence: Passage | None
    window_terms: frozenset[str]
    window_facts: Facts
    window_text: str
    overlap: float  # share of the claim's terms found in the window

    @property
    def found(self) -> bool:
        return self.sentence is not None


_EMPTY = Facts(frozenset(), frozenset(), frozenset(), False)


@dataclass
class ScoringInput:
    """One answer to grade. ``parts`` are the question's sub-questions (or the question alone);
    ``similarity`` is the embedder's cosine between question and answer, when the caller computed it."""

    question: str
    answer: str
    contexts: Sequence[EvidenceContext]
    parts: Sequence[str] = ()
    reference: str | None = None
    now: datetime | None = None
    similarity: float | None = None
    claims: Sequence[Claim] | None = None  # precomputed by the generator; else derived here
    # A word-for-word quote counts as fully supported; benchmarks switch this off to measure the
    # evidence checks on their own.
    quotes_count: bool = True
    _cache: dict[str, object] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not self.parts:
            self.parts = (self.question,)

    @cached_property
    def answer_claims(self) -> list[Claim]:
        """The answer's sentences as claims with their citations checked against the contexts."""
        if self.claims is not None:
            return list(self.claims)
        return verify_claims(self.answer, [c.text for c in self.contexts])

    @cached_property
    def checkable_claims(self) -> list[Claim]:
        """Claims with content to check ("Yes." or "See below." have none)."""
        return [c for c in self.answer_claims if content_terms(c.text)]

    @cached_property
    def sentences(self) -> list[list[Passage]]:
        """Each context's sentences."""
        return [[Passage(s.text, i, j) for j, s in enumerate(split_sentences(c.text) or [])]
                for i, c in enumerate(self.contexts)]

    @cached_property
    def answer_terms(self) -> frozenset[str]:
        return content_terms(strip_markers(self.answer))

    @cached_property
    def answer_facts(self) -> Facts:
        return facts(strip_markers(self.answer))

    @cached_property
    def cited(self) -> list[int]:
        """0-based indexes of the contexts the answer cites, in order of first citation."""
        return [n - 1 for n in cited_numbers(self.answer) if 1 <= n <= len(self.contexts)]

    def quoted_in(self, claim: str) -> int | None:
        """The first context the claim appears in word for word (whole words only: "window is 3"
        is not a quote of "window is 30 days"), or None."""
        needle = f" {normalise(claim)} "
        if not self.quotes_count or not needle.strip():
            return None
        return next((i for i, c in enumerate(self.contexts) if needle in f" {normalise(c.text)} "), None)

    def align(self, claim: str, contexts: Sequence[int] | None = None) -> Alignment:
        """The best-matching sentence (by shared terms; ties to the earlier one) in the given
        contexts (default: all), with one sentence either side."""
        key = f"{claim}\x00{contexts}"
        if key in self._cache:
            return self._cache[key]  # type: ignore[return-value]
        claim_terms = content_terms(claim)
        pool = range(len(self.contexts)) if contexts is None else contexts
        best: Passage | None = None
        best_shared = 0
        for i in pool:
            for sentence in self.sentences[i]:
                shared = len(claim_terms & sentence.terms)
                if shared > best_shared:
                    best, best_shared = sentence, shared
        if best is None or not claim_terms:
            found = Alignment(None, frozenset(), _EMPTY, "", 0.0)
        else:
            window = self.sentences[best.context][max(0, best.index - 1):best.index + 2]
            text = " ".join(s.text for s in window)
            terms = frozenset().union(*(s.terms for s in window))
            found = Alignment(best, terms, facts(text), text, len(claim_terms & terms) / len(claim_terms))
        self._cache[key] = found
        return found


@dataclass(frozen=True)
class Evidence:
    """A claim against what backs it: the share of its terms found there, and its facts checked."""

    overlap: float
    check: FactCheck
    quoted: bool  # the claim stands word for word in a context (that context is its evidence)
    found: bool  # some context shares its words


def evidence_for(inp: ScoringInput, claim: str) -> Evidence:
    """What faithfulness and correctness both start from. A claim quoted from a context is checked
    against that context, the quote itself deciding negation; any other claim against its aligned
    window, negation against the aligned sentence alone (a "not" next door says nothing of it)."""
    quoted = inp.quoted_in(claim)
    if quoted is not None:
        source = inp.contexts[quoted].text
        claim_terms = content_terms(claim)
        overlap = len(claim_terms & content_terms(source)) / len(claim_terms) if claim_terms else 0.0
        return Evidence(overlap, compare(claim, source, claim), quoted=True, found=True)
    aligned = inp.align(claim)
    negation = aligned.sentence.text if aligned.sentence is not None else ""
    return Evidence(aligned.overlap, compare(claim, aligned.window_text, negation), quoted=False,
                    found=aligned.found)


def quoted(text: str, width: int = 80) -> str:
    """A claim as a reason quotes it: whitespace collapsed, cut at a word to ``width``."""
    return textwrap.shorten(text, width, placeholder="…")


def bare(claim: Claim) -> str:
    return strip_markers(claim.text)
