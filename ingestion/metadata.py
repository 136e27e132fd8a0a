"""Metadata extracted from a document's text: dates, identifiers, keywords. Pure functions."""

from __future__ import annotations

import re
from collections import Counter
from datetime import UTC, date, datetime

_MONTHS = {m: i for i, m in enumerate(
    ["january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
     "november", "december"], start=1)}
_MONTHS.update({m[:3]: i for m, i in list(_MONTHS.items())})
_MONTH = (
    r"(jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sep(?:t(?:ember)?)?"
    r"|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)"
)
_ISO = re.compile(r"\b((?:19|20)\d{2})-(\d{2})-(\d{2})\b")
_DAY_MONTH_YEAR = re.compile(rf"\b(\d{{1,2}})(?:st|nd|rd|th)?\s+{_MONTH}\.?,?\s+((?:19|20)\d{{2}})\b", re.I)
_MONTH_DAY_YEAR = re.compile(rf"\b{_MONTH}\.?\s+(\d{{1,2}})(?:st|nd|rd|th)?,?\s+((?:19|20)\d{{2}})\b", re.I)
_MONTH_YEAR = re.compile(rf"\b{_MONTH}\.?\s+((?:19|20)\d{{2}})\b", re.I)

# Codes like ABC-123 or E-4012, and ticket references like #4521.
_IDENTIFIER = re.compile(r"\b[A-Z][A-Z0-9]{0,9}-\d{1,7}\b|(?<![\w&])#\d{2,7}\b")
_WORD = re.compile(r"[A-Za-z][A-Za-z\-]{2,}")
MAX_IDENTIFIERS = 50


def _safe_date(year: int, month: int, day: int) -> date | None:
    try:
        return date(year, month, day)
    except ValueError:
        return None


def extract_dates(text: str) -> list[date]:
    """Every calendar date written in the text (ISO, '5 March 2024', 'March 5, 2024', 'March 2024')."""
    found: set[date] = set()
    for y, m, d in _ISO.findall(text):
        if parsed := _safe_date(int(y), int(m), int(d)):
            found.add(parsed)
    for d, month, y in _DAY_MONTH_YEAR.findall(text):
        if parsed := _safe_date(int(y), _MONTHS[month.lower()[:3]], int(d)):
            found.add(parsed)
    spans_with_day = {m.span() for m in _MONTH_DAY_YEAR.finditer(text)}
    spans_with_day |= {m.span() for m in _DAY_MONTH_YEAR.finditer(text)}
    for month, d, y in _MONTH_DAY_YEAR.findall(text):
        if parsed := _safe_date(int(y), _MONTHS[month.lower()[:3]], int(d)):
            found.add(parsed)
    for match in _MONTH_YEAR.finditer(text):
        # "March 2024" alone means the month; skip when it is part of "5 March 2024".
        if any(s <= match.start() < e for s, e in spans_with_day):
            continue
        found.add(date(int(match.group(2)), _MONTHS[match.group(1).lower()[:3]], 1))
    return sorted(found)


def effective_date(dates: list[date], now: datetime | None = None) -> datetime | None:
    """The latest date not in the future: future dates in a text are plans, not its date."""
    today = (now or datetime.now(UTC)).date()
    past = [d for d in dates if d <= today]
    return datetime(past[-1].year, past[-1].month, past[-1].day, tzinfo=UTC) if past else None


def extract_identifiers(text: str) -> list[str]:
    seen: dict[str, None] = {}
    for match in _IDENTIFIER.findall(text):
        seen.setdefault(match, None)
        if len(seen) >= MAX_IDENTIFIERS:
            break
    return list(seen)


def extract_keywords(text: str, limit: int = 10) -> list[str]:
    """The most frequent content words (lower-cased, stop words removed), ties broken alphabetically."""
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

    counts = Counter(w.lower().strip("-") for w in _WORD.findall(text))
    ranked = sorted(
        ((w, c) for w, c in counts.items()
         if w and w not in ENGLISH_STOP_WORDS and w not in _MONTHS and len(w) > 2),
        key=lambda item: (-item[1], item[0]),
    )
    return [w for w, _ in ranked[:limit]]


def extract_metadata(text: str, now: datetime | None = None) -> dict[str, object]:
    dates = extract_dates(text)
    latest = effective_date(dates, now)
    meta: dict[str, object] = {
        "identifiers": extract_identifiers(text),
        "keywords": extract_keywords(text),
    }
    if dates:
        meta["dates"] = [d.isoformat() for d in dates[-20:]]
    if latest:
        meta["effective_date"] = latest.date().isoformat()
    return meta
