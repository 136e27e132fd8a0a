"""Embedding, LLM and reranking providers: a Protocol each, implementations chosen by config."""
