"""Token counts from one encoding of the document are the tokenizer's own, and the chunker makes the
same chunks with them while tokenizing far less."""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from ingestion.chunking import Chunker, model_tokenizer
from ingestion.loaders import LoadedDocument
from ingestion.token_counts import DocumentTokenCounts
from tests.conftest import REPO_ROOT, SHARED_DATA

TOKENIZE = model_tokenizer()

# Words, punctuation, whitespace of several kinds, accents (combining and precomposed), control
# characters the normaliser deletes, CJK (split per character), symbols that are not punctuation, and
# punctuation newer than the tokenizer's Unicode tables (U+061D, U+2E4F: letters to it).
pieces = st.sampled_from(["play", "ing", "playing", "un", "##", "é", "e\u0301", "naïve", "Straße", "北京", "大学",
                          "\x01", "\x0b", "\u00a0", "\u200b", "\u3000", "\u061d", "\u2e4f", "©", "½", "1,000", "3.14",
                          "e-mail", "(x)", "don't",
                          " ", "  ", "\n", "\t", ".", ",", "—", "…", "$", "Σ", "ﬁ", "a" * 120])


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(pieces, min_size=1, max_size=40), data=st.data())
def test_counts_match_the_tokenizer_for_any_substring(parts: list[str], data: st.DataObject) -> None:
    text = "".join(parts)
    # Mostly where two pieces meet (where a splitter cuts), sometimes anywhere.
    joints = list(itertools.accumulate(map(len, parts), initial=0))
    start = data.draw(st.sampled_from(joints) | st.integers(0, len(text)))
    end = data.draw(st.sampled_from([j for j in joints if j >= start]) | st.integers(start, len(text)))
    counts = DocumentTokenCounts(text, TOKENIZE)
    assert counts.count_at(start, end) == len(TOKENIZE(text[start:end]))
    assert counts.count(text[start:end]) == len(TOKENIZE(text[start:end]))


class CountingTokenizer:
    """The model's tokenizer, counting the characters it is given."""

    def __init__(self) -> None:
        self.characters = 0

    def __call__(self, text: str) -> Sequence[int]:
        self.characters += len(text)
        return TOKENIZE(text)

    def offsets(self, text: str) -> Sequence[tuple[int, int]]:
        self.characters += len(text)
        return TOKENIZE.offsets(text)


class PlainTokenizer(CountingTokenizer):
    """The same without offsets: the chunker measures every piece on its own."""

    offsets = None  # type: ignore[assignment]


def test_the_chunker_makes_the_same_chunks_from_one_encoding() -> None:
    rows = [json.loads(line) for line in (SHARED_DATA / "scifact" / "corpus.jsonl").read_text().splitlines()[:300]]
    docs = [LoadedDocument(r["_id"], f"{r['title']}\n\n{r['text']}", kind="beir") for r in rows]
    docs.append(LoadedDocument("readme", (REPO_ROOT / "docs" / "architecture.md").read_text(), kind="markdown"))
    for options in ({}, {"chunk_size": 48, "chunk_overlap": 8}, {"hierarchical": True, "parent_chunk_size": 512}):
        fast, plain = CountingTokenizer(), PlainTokenizer()
        with_offsets = [Chunker(fast, **options).chunk(doc) for doc in docs]
        alone = [Chunker(plain, **options).chunk(doc) for doc in docs]
        assert with_offsets == alone
        assert sum(map(len, alone)) > len(docs)  # documents were split, so pieces were measured
        # Not vacuous: one encoding per document instead of one per piece considered.
        assert fast.characters < 0.6 * plain.characters, (options, fast.characters, plain.characters)
