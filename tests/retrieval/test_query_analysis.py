"""Patterns, rewrites and sub-queries read from a query (pure functions)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rag_service.pipeline.retrieval.query_analysis import (
    MAX_PATTERNS,
    content_words,
    extract_patterns,
    query_variants,
    split_subqueries,
)


@pytest.mark.parametrize("query, expected", [
    ("error E-4012 when connecting", ["E-4012"]),
    ('what does "exact phrase here" mean', ["exact phrase here"]),
    ("ticket #4521 and ABC-123", ["#4521", "ABC-123"]),
    ("set max_connections and shared_buffers", ["max_connections", "shared_buffers"]),
    ("code 0x80070005 from os.path.join", ["0x80070005", "os.path.join"]),
    ("order 1234567 shipped", ["1234567"]),
    ("IL-6 levels in sepsis", ["IL-6"]),
    ("how do I bake bread", []),
    ("in 2024 we grew", []),  # a year is not an identifier
])
def test_extract_patterns(query: str, expected: list[str]) -> None:
    assert [p.text for p in extract_patterns(query)] == expected


def test_phrases_are_literal_identifiers_are_whole_token_regexes() -> None:
    phrase, ident = extract_patterns('"connection pool" E-4012')
    assert (phrase.mode, phrase.pattern, phrase.kind) == ("literal", "connection pool", "phrase")
    assert ident.mode == "regex" and ident.kind == "identifier"
    # The PostgreSQL regex must match the token alone, not a longer one.
    python_equivalent = ident.pattern.replace("[:alnum:]", "a-zA-Z0-9")
    assert re.search(python_equivalent, "see E-4012.")
    assert not re.search(python_equivalent, "see E-40123")


def test_patterns_are_capped_and_deduplicated() -> None:
    query = " ".join(f"ERR-{i}" for i in range(10)) + " err-1"
    patterns = extract_patterns(query)
    assert len(patterns) == MAX_PATTERNS
    assert len({p.text.lower() for p in patterns}) == len(patterns)


def test_query_variants() -> None:
    assert query_variants("What is the effect of vitamin D on bone density?") == ["effect vitamin D bone density"]
    assert "connection pool timeout" in query_variants("connection-pool timeout")
    assert query_variants("bread") == []  # nothing to rewrite


def test_split_subqueries() -> None:
    assert split_subqueries("What is HNSW? How does IVFFlat differ from it?") == [
        "What is HNSW", "How does IVFFlat differ from it"]
    assert split_subqueries("Explain BM25 scoring; compare RRF fusion methods") == [
        "Explain BM25 scoring", "compare RRF fusion methods"]
    assert split_subqueries("What is the capital of France?") == []
    assert split_subqueries("salt and pepper") == []


def test_content_words_drop_question_framing() -> None:
    assert content_words("How do I reset my password?") == ["reset", "password"]


@given(st.text(max_size=300))
def test_analysis_never_fails(text: str) -> None:
    patterns = extract_patterns(text)
    assert len(patterns) <= MAX_PATTERNS
    assert all(p.pattern for p in patterns)
    assert all(v.strip() for v in query_variants(text))
    assert len(split_subqueries(text)) != 1
