"""Chunking: exact offsets, token budgets, headings, pages, hierarchy."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingestion.chunking import Chunker, chunk_hash, model_tokenizer
from ingestion.loaders import LoadedDocument

TOKENIZE = model_tokenizer()


@pytest.fixture(scope="module")
def chunker() -> Chunker:
    return Chunker(TOKENIZE, chunk_size=64, chunk_overlap=8)


def _check_invariants(doc: LoadedDocument, chunks, size: int) -> None:
    assert chunks, "a non-empty document yields chunks"
    for i, c in enumerate(chunks):
        assert c.ordinal == i
        assert doc.text[c.start_char:c.end_char] == c.text
        assert c.token_count == len(TOKENIZE(c.text))
        assert c.content_hash == chunk_hash(c.text)
        if c.embed:
            assert c.token_count <= size - 2


words = st.text(alphabet=st.characters(codec="utf-8", categories=("L", "N")), min_size=1, max_size=12)
sentences = st.lists(words, min_size=1, max_size=25).map(lambda ws: " ".join(ws) + ".")


@settings(max_examples=60, deadline=None)
@given(paragraphs=st.lists(st.lists(sentences, min_size=1, max_size=8).map(" ".join), min_size=1, max_size=6))
def test_offsets_are_exact_for_any_text(chunker: Chunker, paragraphs: list[str]) -> None:
    doc = LoadedDocument("x", "\n\n".join(paragraphs))
    chunks = chunker.chunk(doc)
    _check_invariants(doc, chunks, 64)
    # Every word of the document is in some chunk: nothing is dropped.
    covered = [False] * len(doc.text)
    for c in chunks:
        covered[c.start_char:c.end_char] = [True] * (c.end_char - c.start_char)
    assert all(covered[i] for i, ch in enumerate(doc.text) if not ch.isspace())


def test_markdown_chunks_carry_their_heading_path(chunker: Chunker) -> None:
    text = "# Guide\n\nIntro.\n\n## Install\n\nRun the installer.\n\n### Linux\n\nUse apt.\n\n## Usage\n\nCall it."
    doc = LoadedDocument("g", text, kind="markdown")
    chunks = chunker.chunk(doc)
    _check_invariants(doc, chunks, 64)
    paths = {c.text.split("\n")[0]: c.metadata.get("heading_path") for c in chunks}
    assert paths == {"# Guide": "Guide", "## Install": "Guide > Install", "### Linux": "Guide > Install > Linux",
                     "## Usage": "Guide > Usage"}


def test_pdf_chunks_know_their_page() -> None:
    chunker = Chunker(TOKENIZE, chunk_size=32, chunk_overlap=0)
    page1 = "Alpha " * 40
    page2 = "Beta " * 40
    text = page1.strip() + "\n\n" + page2.strip()
    doc = LoadedDocument("p", text, kind="pdf", pages=[(0, 1), (len(page1.strip()) + 2, 2)])
    chunks = chunker.chunk(doc)
    _check_invariants(doc, chunks, 32)
    boundary = len(page1.strip()) + 2
    for c in chunks:
        assert c.metadata["page"] == (1 if c.start_char < boundary else 2)
        assert c.metadata.get("page_end", c.metadata["page"]) == (1 if c.end_char <= boundary else 2)


def test_hierarchical_mode_embeds_children_under_parents() -> None:
    chunker = Chunker(TOKENIZE, chunk_size=32, chunk_overlap=4, hierarchical=True, parent_chunk_size=128)
    doc = LoadedDocument("h", " ".join(f"Sentence number {i} talks about topic {i % 7}." for i in range(80)))
    chunks = chunker.chunk(doc)
    _check_invariants(doc, chunks, 32)
    parents = [c for c in chunks if not c.embed]
    children = [c for c in chunks if c.embed]
    assert len(parents) >= 2 and len(children) > len(parents)
    by_ordinal = {c.ordinal: c for c in chunks}
    for child in children:
        parent = by_ordinal[child.parent_ordinal]
        assert not parent.embed
        assert parent.start_char <= child.start_char and child.end_char <= parent.end_char
        assert parent.token_count <= 126


@pytest.mark.parametrize("kwargs", [dict(chunk_size=8), dict(chunk_size=64, chunk_overlap=64),
                                    dict(chunk_size=64, hierarchical=True, parent_chunk_size=64)])
def test_bad_settings_are_refused(kwargs) -> None:
    with pytest.raises(ValueError):
        Chunker(TOKENIZE, **kwargs)
