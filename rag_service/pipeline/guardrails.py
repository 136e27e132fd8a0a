"""Input and output guardrails, as pure functions.

Input: a length limit, control characters stripped, prompt-injection phrasing flagged (recorded,
and the generator is told to treat retrieved text as data), PII detected so logs and traces get
a masked copy. Output: an LLM's answer must not carry injection phrasing (read as prose: "act as"
only as an order), and every citation must point at a retrieved chunk. An extractive answer quotes
its sources, so its phrasing is not checked: a quoted chunk that reads as instructions is flagged in
its metadata at ingestion.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rag_service.domain import MAX_QUESTION_CHARS
from rag_service.errors import InvalidInputError, RagServiceError
from rag_service.text.injection import injection_flags
from rag_service.text.walk import map_strings

__all__ = ["injection_flags"]  # with the input checks' other names; the patterns live in rag_service.text

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\u200b-\u200f\u202a-\u202e\u2066-\u2069]")
_EMAIL = re.compile(r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}\b")
_PHONE = re.compile(r"(?<![\w+])(?:\+\d{1,3}[\s.-]?)?(?:\(\d{2,4}\)[\s.-]?)?\d{2,4}(?:[\s.-]\d{2,4}){2,4}(?!\w)")
_CARD = re.compile(r"(?<!\d)(?:\d[ -]?){12,18}\d(?!\d)")
_IBAN = re.compile(r"\b[A-Z]{2}\d{2}(?:\s?[A-Z0-9]{4}){2,7}(?:\s?[A-Z0-9]{1,4})?\b")


@dataclass(frozen=True)
class PiiMatch:
    kind: str  # email | phone | card | iban
    start: int
    end: int


@dataclass(frozen=True)
class InputCheck:
    text: str                      # what the pipeline works on: control characters removed
    injection: tuple[str, ...]     # names of the injection patterns seen
    pii: tuple[PiiMatch, ...]
    stripped_characters: int
    notes: list[str] = field(default_factory=list)

    @property
    def masked(self) -> str:
        """The text with PII replaced, for logs and traces."""
        return mask_pii(self.text)


def luhn_valid(digits: str) -> bool:
    numbers = [int(d) for d in digits if d.isdigit()]
    if not 13 <= len(numbers) <= 19:
        return False
    total = 0
    for i, n in enumerate(reversed(numbers)):
        if i % 2 == 1:
            n = n * 2 - 9 if n > 4 else n * 2
        total += n
    return total % 10 == 0


def iban_valid(candidate: str) -> bool:
    """ISO 13616 check digits (mod 97 == 1)."""
    compact = candidate.replace(" ", "").upper()
    if not 15 <= len(compact) <= 34:
        return False
    rearranged = compact[4:] + compact[:4]
    try:
        return int("".join(str(int(c, 36)) for c in rearranged)) % 97 == 1
    except ValueError:
        return False


def find_pii(text: str) -> list[PiiMatch]:
    found: list[PiiMatch] = []
    taken: list[tuple[int, int]] = []

    def add(kind: str, start: int, end: int) -> None:
        if not any(start < e and s < end for s, e in taken):
            taken.append((start, end))
            found.append(PiiMatch(kind, start, end))

    for m in _EMAIL.finditer(text):
        add("email", m.start(), m.end())
    for m in _IBAN.finditer(text):
        if iban_valid(m.group()):
            add("iban", m.start(), m.end())
    for m in _CARD.finditer(text):
        if luhn_valid(m.group()):
            add("card", m.start(), m.end())
    for m in _PHONE.finditer(text):
        if sum(c.isdigit() for c in m.group()) >= 7:
            add("phone", m.start(), m.end())
    return sorted(found, key=lambda p: p.start)


def mask_pii(text: str) -> str:
    out, last = [], 0
    for match in find_pii(text):
        out.append(text[last:match.start])
        out.append(f"[{match.kind.upper()}]")
        last = match.end
    out.append(text[last:])
    return "".join(out)


def mask_pii_deep(value: Any) -> Any:
    """``mask_pii`` applied to every string inside dicts and lists (for stored JSON)."""
    return map_strings(mask_pii, value)



def check_input(question: str, max_chars: int = MAX_QUESTION_CHARS) -> InputCheck:
    """Clean and inspect a question. Raises InvalidInputError when nothing usable is left or it
    is over the limit (the caller shortens it; silently truncating would change the question)."""
    normalised = unicodedata.normalize("NFKC", question)
    cleaned = _CONTROL.sub("", normalised.replace("\t", " ").replace("\r\n", "\n").replace("\r", "\n"))
    cleaned = re.sub(r"[ \u00a0]{2,}", " ", cleaned).strip()
    if not cleaned:
        raise InvalidInputError("the question is empty once control characters are removed; ask something")
    if len(cleaned) > max_chars:
        raise InvalidInputError(f"the question is {len(cleaned)} characters; the limit is {max_chars}. Shorten it")
    return InputCheck(text=cleaned, injection=injection_flags(cleaned), pii=tuple(find_pii(cleaned)),
                      stripped_characters=len(normalised) - len(_CONTROL.sub("", normalised)))


@dataclass(frozen=True)
class OutputCheck:
    ok: bool
    problems: tuple[str, ...]
    unresolved_citations: tuple[int, ...]


class OutputRejectedError(RagServiceError):
    """The output check found problems in a generated answer (the verify step repairs it)."""

    def __init__(self, problems: Sequence[str], unresolved: Sequence[int]) -> None:
        super().__init__("; ".join(problems), stage="verify")
        self.problems = tuple(problems)
        self.unresolved = set(unresolved)


def check_output(answer: str, cited: Iterable[int], available: int, quoted: bool = False) -> OutputCheck:
    """The answer must not carry injection phrasing (a generator that obeyed instructions hidden
    in a source would show it here), and every cited number must be within 1..available. An answer
    ``quoted`` from the sources (the extractive generator's) repeats them and cannot obey them, so
    its phrasing is not checked."""
    problems = []
    flags = () if quoted else injection_flags(answer, prose=True)
    if flags:
        problems.append(f"answer contains injection phrasing: {', '.join(flags)}")
    unresolved = tuple(sorted({n for n in cited if not 1 <= n <= available}))
    if unresolved:
        problems.append(f"citations {list(unresolved)} do not point at a retrieved chunk")
    return OutputCheck(ok=not problems, problems=tuple(problems), unresolved_citations=unresolved)
