"""rag-service: a self-hosted RAG knowledge service."""

__version__ = "0.1.0"
