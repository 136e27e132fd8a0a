-- Langfuse keeps its own database on the same PostgreSQL server.
CREATE DATABASE langfuse;
