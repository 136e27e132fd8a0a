"""A sentence's syntax as the short-answer scorer reads it: words with their dependency arcs,
named entities and noun chunks, all by character offsets into the parsed text. The parser that
makes them (spaCy's English pipeline) is a provider; the scorer only reads these.

Two depths: ``full`` (tagger, dependency parser and named entities) and ``entities`` (the named
entities alone: the words carry no tags or arcs, each word is its own head, and there are no noun
chunks), which costs about 40% of the full parse."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ParseDepth = Literal["entities", "full"]


@dataclass(frozen=True)
class Word:
    start: int   # character offsets in the parsed text
    end: int
    text: str
    pos: str     # universal part of speech: NOUN, VERB, PROPN ...
    tag: str     # Penn Treebank tag: WP, WDT, WRB ...
    dep: str     # dependency label: nsubj, dobj, pobj ...
    head: int    # index of the head word (the root is its own head)


@dataclass(frozen=True)
class Entity:
    start: int
    end: int
    label: str   # OntoNotes type: PERSON, ORG, GPE, DATE, CARDINAL ...


@dataclass(frozen=True)
class Parsed:
    text: str
    words: tuple[Word, ...]
    entities: tuple[Entity, ...]
    noun_chunks: tuple[tuple[int, int], ...]  # (start, end) character offsets
    tree: bool = True  # False at the "entities" depth: no tags, arcs or noun chunks

    def ancestors(self, i: int) -> list[int]:
        """Indices of word ``i``'s heads, nearest first, up to the root."""
        out: list[int] = []
        while self.words[i].head != i and len(out) < len(self.words):
            i = self.words[i].head
            out.append(i)
        return out
