"""Data access outside the vector store: one small repository per aggregate, each a class with
typed methods over the async engine. SQL lives here (and in the store), nowhere else."""

from rag_service.db.repos.catalog import DocumentCatalog
from rag_service.db.repos.guidelines import GuidelineRepository
from rag_service.db.repos.jobs import JobRepository
from rag_service.db.repos.keys import ApiKeyRepository
from rag_service.db.repos.query_log import QueryLog

__all__ = ["ApiKeyRepository", "DocumentCatalog", "GuidelineRepository", "JobRepository", "QueryLog"]
