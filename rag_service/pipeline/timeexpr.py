"""Time expressions in questions, resolved against "now" into [start, end) ranges (pure).

Handles what people type when they scope a question in time: today, yesterday, this/last
week/month/quarter/year, last/past N days/weeks/months/years, in 2024, in March (2025), in Q2 2025,
since March, since 2023, before/after 2024, between 2022 and 2024, and ISO dates after since/before.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

_MONTHS = {m: i + 1 for i, m in enumerate(
    ["january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
     "november", "december"])}
_MONTHS.update({m[:3]: i for m, i in list(_MONTHS.items())})
_MONTHS["sept"] = 9
_MONTH = r"(jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sept?(?:ember)?|" \
         r"oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)"
_YEAR = r"((?:19|20)\d{2})"
_UNITS = {"day": 1, "week": 7, "month": 30, "year": 365}
_NUMBER_WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9,
                 "ten": 10, "twelve": 12, "a": 1, "an": 1}


@dataclass(frozen=True)
class TimeRange:
    expression: str
    start: datetime | None  # inclusive
    end: datetime | None    # exclusive


def _month_start(year: int, month: int) -> datetime:
    return datetime(year, month, 1, tzinfo=UTC)


def _add_months(moment: datetime, months: int) -> datetime:
    index = moment.year * 12 + moment.month - 1 + months
    return _month_start(index // 12, index % 12 + 1)


def _month_number(token: str) -> int:
    token = token.lower().rstrip(".")
    return _MONTHS.get(token) or _MONTHS[token[:3]]


def _latest_month(month: int, now: datetime, allow_current: bool = True) -> datetime:
    """The most recent start of ``month`` not after now (this year's when it has begun)."""
    year = now.year if (month < now.month or (allow_current and month == now.month)) else now.year - 1
    return _month_start(year, month)


def _iso(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


_RULES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(rf"\bbetween\s+{_YEAR}\s+and\s+{_YEAR}\b", re.I), "between_years"),
    (re.compile(r"\b(since|after|from)\s+(\d{4}-\d{2}-\d{2})\b", re.I), "since_iso"),
    (re.compile(r"\b(before|until|till)\s+(\d{4}-\d{2}-\d{2})\b", re.I), "before_iso"),
    (re.compile(rf"\b(?:in\s+|during\s+)?q([1-4])\s*(?:of\s+)?{_YEAR}\b", re.I), "quarter"),
    (re.compile(rf"\b(?:in\s+|during\s+)?{_YEAR}\s*q([1-4])\b", re.I), "year_quarter"),
    (re.compile(rf"\b(since|after)\s+{_MONTH}\.?(?:\s+{_YEAR})?\b", re.I), "since_month"),
    (re.compile(rf"\b(before|until)\s+{_MONTH}\.?(?:\s+{_YEAR})?\b", re.I), "before_month"),
    (re.compile(rf"\b(since|after)\s+{_YEAR}\b", re.I), "since_year"),
    (re.compile(rf"\b(before|until)\s+{_YEAR}\b", re.I), "before_year"),
    (re.compile(rf"\b(?:in|during)\s+{_MONTH}\.?(?:\s+{_YEAR})?\b", re.I), "in_month"),
    (re.compile(rf"\b{_MONTH}\s+{_YEAR}\b", re.I), "month_year"),
    (re.compile(rf"\b(?:in|during)\s+{_YEAR}\b", re.I), "in_year"),
    (re.compile(r"\b(?:in\s+the\s+)?(?:last|past|previous)\s+(\d+|one|two|three|four|five|six|seven|eight|nine|ten|"
                r"twelve)\s+(day|week|month|year)s?\b", re.I), "last_n"),
    (re.compile(r"\b(this|last|previous|past)\s+(week|month|quarter|year)\b", re.I), "this_last"),
    (re.compile(r"\b(today|yesterday)\b", re.I), "day"),
]


def extract_time_ranges(text: str, now: datetime) -> list[TimeRange]:
    """Every time expression in ``text`` with its range, in the order found, overlaps removed."""
    if now.tzinfo is None:
        now = now.replace(tzinfo=UTC)
    today = now.replace(hour=0, minute=0, second=0, microsecond=0)
    found: list[tuple[int, TimeRange]] = []
    taken: list[tuple[int, int]] = []
    for pattern, kind in _RULES:
        for m in pattern.finditer(text):
            if any(m.start() < e and s < m.end() for s, e in taken):
                continue
            resolved = _resolve(kind, m, now, today)
            if resolved is None:
                continue
            taken.append((m.start(), m.end()))
            found.append((m.start(), TimeRange(m.group(0).strip(), *resolved)))
    return [r for _, r in sorted(found, key=lambda f: f[0])]


def _resolve(kind: str, m: re.Match[str], now: datetime,
             today: datetime) -> tuple[datetime | None, datetime | None] | None:
    g = m.groups()
    if kind == "between_years":
        a, b = sorted((int(g[0]), int(g[1])))
        return datetime(a, 1, 1, tzinfo=UTC), datetime(b + 1, 1, 1, tzinfo=UTC)
    if kind == "since_iso":
        return _iso(g[1]), None
    if kind == "before_iso":
        return None, _iso(g[1])
    if kind in ("quarter", "year_quarter"):
        quarter, year = (int(g[0]), int(g[1])) if kind == "quarter" else (int(g[1]), int(g[0]))
        start = _month_start(year, 3 * (quarter - 1) + 1)
        return start, _add_months(start, 3)
    if kind in ("since_month", "before_month"):
        month = _month_number(g[1])
        start = _month_start(int(g[2]), month) if g[2] else _latest_month(month, now)
        return (start, None) if kind == "since_month" else (None, start)
    if kind == "since_year":
        year = int(g[1])
        return (datetime(year, 1, 1, tzinfo=UTC) if g[0].lower() == "since" else datetime(year + 1, 1, 1, tzinfo=UTC),
                None)
    if kind == "before_year":
        return None, datetime(int(g[1]), 1, 1, tzinfo=UTC)
    if kind in ("in_month", "month_year"):
        month = _month_number(g[0])
        start = _month_start(int(g[1]), month) if g[1] else _latest_month(month, now)
        return start, _add_months(start, 1)
    if kind == "in_year":
        year = int(g[0])
        return datetime(year, 1, 1, tzinfo=UTC), datetime(year + 1, 1, 1, tzinfo=UTC)
    if kind == "last_n":
        n = int(g[0]) if g[0].isdigit() else _NUMBER_WORDS[g[0].lower()]
        unit = g[1].lower()
        if unit == "month":
            return _add_months(today, -n).replace(day=min(today.day, 28)), now
        return today - timedelta(days=n * _UNITS[unit]), now
    if kind == "this_last":
        which, unit = g[0].lower(), g[1].lower()
        offset = 0 if which == "this" else -1
        if unit == "week":
            start = today - timedelta(days=today.weekday()) + timedelta(weeks=offset)
            return start, start + timedelta(weeks=1)
        if unit == "month":
            start = _add_months(_month_start(today.year, today.month), offset)
            return start, _add_months(start, 1)
        if unit == "quarter":
            start = _add_months(_month_start(today.year, 3 * ((today.month - 1) // 3) + 1), 3 * offset)
            return start, _add_months(start, 3)
        start = datetime(today.year + offset, 1, 1, tzinfo=UTC)
        return start, datetime(start.year + 1, 1, 1, tzinfo=UTC)
    if kind == "day":
        start = today if g[0].lower() == "today" else today - timedelta(days=1)
        return start, start + timedelta(days=1)
    return None
