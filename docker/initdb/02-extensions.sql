-- The service's migrations create these too; enabling them here lets a database role without
-- CREATE EXTENSION rights run the migrations.
CREATE EXTENSION IF NOT EXISTS vector;
CREATE EXTENSION IF NOT EXISTS pg_trgm;
