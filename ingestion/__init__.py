"""Document ingestion (loaders, chunking, metadata, incremental re-ingest, jobs).

Thin for now: the ingestion issue fills this package. The storage it writes through is
``rag_service.stores.VectorStore`` and the embedder is ``rag_service.providers.embeddings``.
"""
