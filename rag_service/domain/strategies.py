"""The one registry of retrieval strategy names.

Settings, the search and query APIs and the router's guidelines accept exactly the names
registered here. The four built-in strategies are known from the start (so Settings can be
validated before the pipeline is imported); the pipeline registers each name together with the
factory that builds it (``pipeline/retrieval/strategies.py::register_strategy``), so a strategy
registered there can be requested everywhere without touching another list.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Annotated, Any

from pydantic import AfterValidator, Field

_NAMES: dict[str, str] = {
    "semantic": "cosine nearest neighbours of the question's embedding",
    "keyword": "Okapi BM25 over the question's terms",
    "metadata": "chunks selected by the structured filters alone",
    "pattern": "identifiers and quoted phrases matched exactly",
}
BUILTIN_STRATEGIES = tuple(_NAMES)
_NAME_PATTERN = r"^[a-z][a-z0-9_]{0,39}$"


def strategy_names() -> tuple[str, ...]:
    """Every registered strategy name, built-ins first."""
    return tuple(_NAMES)


def add_strategy_name(name: str, description: str | None = None) -> None:
    """Register a name (a known name keeps its description unless a new one is given)."""
    if not re.match(_NAME_PATTERN, name):
        raise ValueError(f"strategy name {name!r} must be 1-40 lowercase letters, digits or '_'")
    _NAMES[name] = description or _NAMES.get(name) or f"the {name} strategy"


def remove_strategy_name(name: str) -> None:
    if name in BUILTIN_STRATEGIES:
        raise ValueError(f"{name!r} is a built-in strategy and cannot be removed")
    _NAMES.pop(name, None)


def check_strategy_name(name: str) -> str:
    if name not in _NAMES:
        raise ValueError(f"unknown strategy {name!r}; known: {', '.join(_NAMES)}")
    return name


def check_strategy_names(names: Iterable[str]) -> tuple[str, ...]:
    """The names, de-duplicated in order; an unknown name is an error that lists the known ones."""
    return tuple(dict.fromkeys(check_strategy_name(n) for n in names))


def _names_in_schema(schema: dict[str, Any]) -> None:
    # Read when the schema is generated (FastAPI does so on the first /openapi.json), so a
    # strategy registered at start-up is listed too.
    schema["enum"] = list(_NAMES)


StrategyName = Annotated[str, AfterValidator(check_strategy_name), Field(json_schema_extra=_names_in_schema)]
