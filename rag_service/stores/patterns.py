"""Validation of user-supplied search patterns, shared by every store."""

from __future__ import annotations

import re

from rag_service.errors import InvalidInputError

MAX_PATTERN_LENGTH = 256

# Back-references make regex matching super-linear in PostgreSQL's engine as in most others;
# lookarounds are not supported the same way everywhere. Neither is needed to find identifiers.
_FORBIDDEN = re.compile(r"\\[1-9]|\(\?[=!<]|\\k<")


def validate_pattern(pattern: str, mode: str) -> str:
    """Return the pattern if it is safe to run, else raise InvalidInputError saying why."""
    if mode not in ("literal", "regex"):
        raise InvalidInputError(f"pattern mode must be 'literal' or 'regex', not {mode!r}")
    if not pattern or not pattern.strip():
        raise InvalidInputError("pattern must not be empty")
    if len(pattern) > MAX_PATTERN_LENGTH:
        raise InvalidInputError(f"pattern is {len(pattern)} characters; the limit is {MAX_PATTERN_LENGTH}")
    if "\x00" in pattern:
        raise InvalidInputError("pattern must not contain NUL characters")
    if mode == "regex" and _FORBIDDEN.search(pattern):
        raise InvalidInputError("regex patterns may not use back-references or lookarounds")
    # Syntax is checked by the store that runs the pattern: dialects differ (PostgreSQL: \y, not \b).
    return pattern


def escape_like(literal: str) -> str:
    r"""Escape LIKE wildcards so the literal matches itself (used with ESCAPE '\')."""
    return literal.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
