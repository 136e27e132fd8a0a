"""The terms that answer scoring and citation checks compare (pure): content words, stemmed
with Snowball English (PyStemmer), the same stemmer PostgreSQL's ``english`` text search uses, so
"kneading" matches "knead" here as it does in the keyword index."""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache, wraps
from typing import TypeVar

import Stemmer


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9'-]*")
STOP_WORDS = _words(
    "a an the of in on at to for from by with about as into over under between and or but not no nor is are was "
    "were be been being do does did have has had this that these those it its there their they them what which "
    "who whom whose when where why how can could should would will shall may might must i you we he she his her "
    "our your my me us than then so such also very just only any some all each other more most many much"
)
_STEMMER = Stemmer.Stemmer("english")


T = TypeVar("T")
SHORT_TEXT = 2_000  # texts up to this long are cached (sentences, claims); whole documents are not


def cache_short_texts(maxsize: int, keep: Callable[[str], bool] | None = None,
                      ) -> Callable[[Callable[[str], T]], Callable[[str], T]]:
    """An LRU cache for a function of one text that leaves long texts out (and those ``keep`` turns
    down, where a short text could still give a large result), so the cache's memory stays bounded
    whatever callers send: at most maxsize texts of SHORT_TEXT characters, and their results."""

    def decorate(fn: Callable[[str], T]) -> Callable[[str], T]:
        cached = lru_cache(maxsize=maxsize)(fn)

        @wraps(fn)
        def call(text: str) -> T:
            return cached(text) if len(text) <= SHORT_TEXT and (keep is None or keep(text)) else fn(text)

        call.cache_clear = cached.cache_clear  # type: ignore[attr-defined]
        call.cache_info = cached.cache_info  # type: ignore[attr-defined]
        return call

    return decorate


@lru_cache(maxsize=65_536)
def stem(word: str) -> str:
    """Snowball English ("Porter2") of the lower-cased word; cached, as answers reuse few words."""
    return _STEMMER.stemWord(word.lower().strip("'"))


def terms(text: str) -> list[str]:
    """Content terms (stop words dropped, stemmed), in order (a list of one's own: the cache keeps its tuple)."""
    return list(_terms(text))


# The same chunks come back query after query (a collection's hot passages), and the generator reads
# each one's terms more than once per answer: 0.5 ms of an answer's 1.2 ms of term scanning on XQuAD.
# An entry holds at most SHORT_TEXT / 2 terms (8 KB of references; the strings are mostly the
# stemmer's cached ones), about 2 KB for a usual chunk.
@cache_short_texts(maxsize=4096)
def _terms(text: str) -> tuple[str, ...]:
    return tuple(stem(w) for w in _WORD.findall(text) if w.lower() not in STOP_WORDS)


def term_spans(text: str) -> list[tuple[int, int, str]]:
    """``terms`` with where each word stands in ``text``: (start, end, term), in order."""
    return [(m.start(), m.end(), stem(m.group())) for m in _WORD.finditer(text) if m.group().lower() not in STOP_WORDS]

