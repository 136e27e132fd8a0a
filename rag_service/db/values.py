"""Values on their way into PostgreSQL."""

from __future__ import annotations

from typing import Any


def strip_nul(value: Any) -> Any:
    """PostgreSQL text and jsonb cannot hold NUL characters; drop them wherever they hide."""
    if isinstance(value, str):
        return value.replace("\x00", "")
    if isinstance(value, dict):
        return {strip_nul(k): strip_nul(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [strip_nul(v) for v in value]
    return value
