"""Database URLs as they may be shown: in errors, `ragsvc status` and the logs' context.

Kept apart from the Settings (which use it in their own error messages) because the db layer and
the CLI show URLs too; the logs' Redactor (observability/logs.py) masks URLs inside free text.
"""

from __future__ import annotations

import re


def hide_password(url: str) -> str:
    """The URL with its password (in the authority or as ?password=) replaced by ***."""
    masked = re.sub(r"(://[^:/@]*:)[^@]+@", r"\1***@", url)
    return re.sub(r"([?&]password=)[^&]*", r"\1***", masked, flags=re.I)
