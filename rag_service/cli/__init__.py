"""The ``ragsvc`` command. Every command that reports something takes ``--json`` and then prints
exactly one JSON object on stdout; human-readable output and logs go to stderr or the terminal.

Commands live in small modules by topic; importing them registers them on ``app``."""

# Imported in the order `ragsvc --help` lists the commands.
from rag_service.cli import server, mcp, ingest, query, review, prompts, experiments, eval, db, keys, tenants  # isort: skip
from rag_service.cli.common import app

__all__ = ["app", "db", "eval", "experiments", "ingest", "keys", "mcp", "prompts", "query", "review", "server",
           "tenants"]

