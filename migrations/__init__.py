"""Alembic environment and versions: the only way the schema changes."""
