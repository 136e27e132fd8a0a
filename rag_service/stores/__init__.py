"""Store adapters: the core VectorStore Protocol, the capability Protocols, and their implementations."""

from rag_service.stores.base import (
    KeywordSearch,
    MetadataSearch,
    PatternMode,
    PatternSearch,
    RecencyOrder,
    VectorStore,
)

__all__ = ["KeywordSearch", "MetadataSearch", "PatternMode", "PatternSearch", "RecencyOrder", "VectorStore"]
