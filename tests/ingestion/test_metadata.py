"""Metadata extraction as table tests."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest

from ingestion.metadata import effective_date, extract_dates, extract_identifiers, extract_keywords, extract_metadata

NOW = datetime(2026, 1, 15, tzinfo=UTC)


@pytest.mark.parametrize("text, expected", [
    ("released 2024-03-05", [date(2024, 3, 5)]),
    ("on 5 March 2024 and 7th June 2023", [date(2023, 6, 7), date(2024, 3, 5)]),
    ("March 5, 2024", [date(2024, 3, 5)]),
    ("in Sept 2022", [date(2022, 9, 1)]),
    ("5 March 2024 only", [date(2024, 3, 5)]),  # not also 2024-03-01
    ("2024-02-30 is not a date", []),
    ("version 2024 of the spec", []),
])
def test_dates(text: str, expected: list[date]) -> None:
    assert extract_dates(text) == expected


def test_effective_date_is_latest_past_date() -> None:
    dates = [date(2023, 1, 1), date(2025, 12, 31), date(2030, 1, 1)]
    assert effective_date(dates, NOW) == datetime(2025, 12, 31, tzinfo=UTC)
    assert effective_date([date(2030, 1, 1)], NOW) is None


@pytest.mark.parametrize("text, expected", [
    ("error E-4012 then ABC-123 and E-4012 again", ["E-4012", "ABC-123"]),
    ("see ticket #4521, not #1 or a&#39;", ["#4521"]),
    ("lowercase abc-123 is prose", []),
])
def test_identifiers(text: str, expected: list[str]) -> None:
    assert extract_identifiers(text) == expected


def test_keywords_skip_stop_words_and_rank_by_frequency() -> None:
    text = "The vector index. The vector store keeps vectors; an index helps. Store vector."
    assert extract_keywords(text, limit=3) == ["vector", "index", "store"]


def test_extract_metadata_combines_everything() -> None:
    meta = extract_metadata("Incident INC-42 on 2025-06-01 and 2025-07-01 about the database.", NOW)
    assert meta["identifiers"] == ["INC-42"]
    assert meta["effective_date"] == "2025-07-01"
    assert meta["dates"] == ["2025-06-01", "2025-07-01"]
    assert "database" in meta["keywords"]
