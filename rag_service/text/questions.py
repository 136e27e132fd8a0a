"""What a question asks for (pure): the kind of fact its wording expects, and its focus (the
content terms and the names and numbers it mentions). English question words; a question in
another language simply has no expected kind.

One place for these patterns: the extractive generator uses them to pick a short answer and to
judge whether the evidence answers at all, the relevance scorer to check the answer holds the
kind of fact asked for.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from rag_service.text.facts import facts
from rag_service.text.terms import STOP_WORDS, cache_short_texts, terms

AnswerKind = Literal["number", "date", "person", "place", "name"]

# First match wins: "how many years" asks for a number, "what year" for a date.
_KINDS: tuple[tuple[re.Pattern[str], AnswerKind], ...] = (
    (re.compile(r"\b(how (many|much|long|far|old|big|large|tall|high|often|wide|deep)|"
                r"what (percentage|percent|proportion|number|amount|size|fraction)|how much)\b", re.I), "number"),
    (re.compile(r"\b(when|(what|which) (year|date|day|month|decade|century|time period|time|era))\b", re.I), "date"),
    (re.compile(r"\b(who|whom|whose|(what|which) (person|man|woman|king|queen|emperor|president|scientist|"
                r"author|writer|player|leader|artist|engineer|inventor))\b", re.I), "person"),
    (re.compile(r"\b(where|(what|which) (city|country|state|place|region|continent|town|location|county|"
                r"province|island|river|nation|area))\b", re.I), "place"),
    (re.compile(r"\b((what|which) (team|company|organi[sz]ation|group|university|college|school|party|band|"
                r"network|agency|institution|church|league|club|firm|newspaper|station)|"
                r"what is the name|name of the)\b", re.I), "name"),
)
# A reason or a manner is a clause, not a span: "why ...?", "how did ...?" (not "how many").
_CLAUSE_ANSWER = re.compile(r"^\s*(why\b|how (do|does|did|is|are|was|were|can|could|should|would|has|have|had)\b)",
                            re.I)
_CAPITALISED = re.compile(r"\b[A-Z][A-Za-z0-9'.-]*|\b\d[\d,.]*\b")


# A question asks with a question mark, or, typed into a search box without one: with a question
# word first, or after a first preposition ("in what year ..."); with an auxiliary or "name" first
# ("is it ...", "name a ..."); with "what" or "how many/much/..." anywhere ("for a field f, what
# would be ..."); or with a question word last ("... can be traced to where"). "who", "which",
# "whose" and "whom" elsewhere are mostly relative pronouns ("patients who smoke").
_ASKS = re.compile(r"^\W*((in|on|at|of|for|from|by|with|to|during|after|before|since|under|between|among|"
                   r"according to)\s+)?(who|whom|whose|what|which|when|where|why|how)\b|"
                   r"^\W*(is|are|was|were|do|does|did|can|could|should|would|will|has|have|had|name)\b|"
                   r"\b(what|how (many|much|long|old|far|big|large))\b|"
                   r"\b(who|whom|whose|what|which|when|where|why|how)\W*$", re.I)


def is_question(text: str) -> bool:
    """Whether ``text`` is asked as a question, rather than stated ("A20 acts as a tumour
    suppressor.") or given as keywords ("error E-4012")."""
    return text.rstrip().endswith("?") or bool(_ASKS.search(text))


_CLOSERS = "\"')]}\u201d\u2019"  # what may close a sentence after its full stop


def is_statement(text: str) -> bool:
    """Whether ``text`` is stated as a sentence: not a question, and ended by a full stop or an
    exclamation mark (inside closing quotes or brackets too). Keywords typed into a search box
    ("warsaw population") are neither question nor statement, unless they end with an
    abbreviation's full stop ("washington d.c."), which this cannot tell from a sentence's."""
    return not is_question(text) and text.rstrip().rstrip(_CLOSERS).endswith((".", "!"))


def expected_kind(question: str) -> AnswerKind | None:
    """The kind of fact the question asks for, when its wording says."""
    for pattern, kind in _KINDS:
        if pattern.search(question):
            return kind
    return None


def wants_clause(question: str) -> bool:
    """Whether the question asks for a reason or a manner (answered by a clause, not a short span)."""
    return bool(_CLAUSE_ANSWER.search(question))


def has_new_fact(kind: str, answer: str, question: str) -> bool:
    """Whether ``answer`` states a fact of the asked kind that the question does not already state
    (a person, a place and other names are all names; a year counts as a date)."""
    asked, said = facts(question), facts(answer)
    if kind == "date":
        new = (said.dates - asked.dates) | {n for n in said.numbers - asked.numbers if len(n) == 4}
        return bool(new or (said.numbers - asked.numbers and said.dates))
    fact_kind = "number" if kind == "number" else "name"
    return bool(said.of_kind(fact_kind) - asked.of_kind(fact_kind))


@dataclass(frozen=True)
class Focus:
    """What a question is about: its content terms (stemmed), the names and numbers it mentions
    (stemmed; the words a web search would quote), and its adjacent content-term pairs."""

    kind: AnswerKind | None
    terms: frozenset[str]
    entities: frozenset[str]
    pairs: frozenset[tuple[str, str]]


@cache_short_texts(maxsize=4096)
def focus(question: str) -> Focus:
    words = question.split()
    # A capital on the first word says nothing: "What", "Name" and "In" start questions.
    rest = " ".join(words[1:])
    entities = {t for m in _CAPITALISED.finditer(rest) if m.group(0).lower() not in STOP_WORDS
                for t in terms(m.group(0))}
    ordered = terms(question)
    return Focus(kind=expected_kind(question), terms=frozenset(ordered), entities=frozenset(entities),
                 pairs=frozenset(zip(ordered, ordered[1:], strict=False)))
