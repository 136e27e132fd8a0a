"""Vector-store adapters: the Protocol and its implementations."""

from rag_service.stores.base import StoreCounts, VectorStore

__all__ = ["StoreCounts", "VectorStore"]
