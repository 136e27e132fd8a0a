"""One function over every string inside JSON-like data."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def map_strings(fn: Callable[[str], str], value: Any) -> Any:
    """``fn`` applied to every string inside dicts, lists and tuples (as lists); other values as they are."""
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, dict):
        return {k: map_strings(fn, v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [map_strings(fn, v) for v in value]
    return value
