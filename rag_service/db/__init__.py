"""Database access: table models, the embedded PostgreSQL default, engines and migrations."""
