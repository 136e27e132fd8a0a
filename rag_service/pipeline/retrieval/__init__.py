"""Multi-strategy retrieval: strategies, fusion, reranking and the adaptive loop."""
