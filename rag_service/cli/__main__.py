"""``python -m rag_service.cli``: the same as ``ragsvc``."""

from rag_service.cli import app

app()
