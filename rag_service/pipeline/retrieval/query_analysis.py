"""Pure functions that read a query: exact patterns to look for, rule-based rewrites, sub-queries."""

from __future__ import annotations

import re
from dataclasses import dataclass

from rag_service.stores.base import PatternMode

MAX_PATTERNS = 5

_QUOTED = re.compile(r'"([^"]{2,200})"|“([^”]{2,200})”')
# ABC-123, E-4012, IL-6, RFC-9110; #4521; snake_case and dotted names; hex codes; long numbers.
_IDENTIFIER = re.compile(
    r"(?<![\w-])(?:"
    r"[A-Za-z][A-Za-z0-9]{0,9}-\d{1,7}[A-Za-z]?"      # E-4012, IL-6, CVE-2024 style
    r"|#\d{2,7}"                                       # ticket numbers
    r"|0x[0-9A-Fa-f]{2,16}"                            # hex codes
    r"|[a-z][a-z0-9]*(?:_[a-z0-9]+)+"                  # snake_case settings
    r"|[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*){2,}"  # dotted.names.three
    r"|\d{5,}"                                         # order numbers and the like
    r")(?![\w-])"
)
_BOUNDARY_L = "(^|[^[:alnum:]_])"
_BOUNDARY_R = "($|[^[:alnum:]_])"

def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_QUESTION_WORDS = _words(
    "what which who whom whose when where why how is are was were do does did can could should would "
    "will shall may might must tell me please explain describe give list show find"
)
_STOPWORDS = _words(
    "a an the of in on at to for from by with about as into over under between and or but not no "
    "this that these those it its be been being there their they them we you your our i my"
)
_WORD = re.compile(r"[\w][\w'-]*")
_LEADING_CONJUNCTION = re.compile(r"^(?:and|also|then|plus)\s+", re.I)
_SPLIT = re.compile(r"\?\s+|;\s*|\s+(?:and also|as well as|and then|and how|and what|and why|and when|and where)\s+",
                    re.I)


@dataclass(frozen=True)
class PatternSpec:
    """Something the query names exactly. ``text`` is what a reader typed; ``pattern`` what runs."""

    text: str
    pattern: str
    mode: PatternMode
    kind: str  # "phrase" | "identifier"


def _regex_literal(value: str) -> str:
    # PostgreSQL's ARE treats a backslash before a non-alphanumeric character as that character.
    return re.sub(r"([^\w\s])", r"\\\1", value)


def extract_patterns(query: str) -> list[PatternSpec]:
    """Quoted phrases (matched literally) and identifiers (matched as whole tokens), at most
    MAX_PATTERNS, in the order they appear."""
    found: list[PatternSpec] = []
    seen: set[str] = set()
    for match in _QUOTED.finditer(query):
        phrase = " ".join((match.group(1) or match.group(2)).split())
        if phrase and phrase.lower() not in seen:
            seen.add(phrase.lower())
            found.append(PatternSpec(phrase, phrase, "literal", "phrase"))
    unquoted = _QUOTED.sub(" ", query)
    for match in _IDENTIFIER.finditer(unquoted):
        token = match.group(0)
        if token.lower() not in seen:
            seen.add(token.lower())
            found.append(PatternSpec(token, _BOUNDARY_L + _regex_literal(token) + _BOUNDARY_R, "regex", "identifier"))
    return found[:MAX_PATTERNS]


def content_words(query: str) -> list[str]:
    """The query's words without question words and stopwords, in order."""
    words = _WORD.findall(query)
    return [w for w in words if w.lower() not in _QUESTION_WORDS and w.lower() not in _STOPWORDS]


def query_variants(query: str) -> list[str]:
    """Rule-based rewrites for a retry: the bare content words (drops the question's framing,
    which can dominate a short query's embedding), and hyphenated/camel-case terms split apart.
    Never returns the query itself or duplicates."""
    variants: list[str] = []
    words = content_words(query)
    if words:
        variants.append(" ".join(words))
    split = re.sub(r"(?<=[a-z])(?=[A-Z])|[-_/]", " ", query)
    if split != query:
        variants.append(" ".join(split.split()))
    normalised = " ".join(query.split()).lower()
    unique: list[str] = []
    for variant in variants:
        if variant.strip() and variant.lower() != normalised and variant.lower() not in {u.lower() for u in unique}:
            unique.append(variant)
    return unique


def split_subqueries(query: str) -> list[str]:
    """Parts of a multi-part question ("What is X? And how does Y work?", "X; Y", "X and also Y").
    A single question comes back as an empty list. Parts without a content word ("and why?")
    are dropped: they are not questions on their own."""
    parts = [_LEADING_CONJUNCTION.sub("", p.strip(" ?.!")) for p in _SPLIT.split(query)]
    parts = [p for p in parts if content_words(p)]
    return parts if len(parts) >= 2 else []
