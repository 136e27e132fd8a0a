"""The seven answer metrics as pure functions: each returns a MetricScore (value in [0, 1] or None,
a one-sentence reason, the scorer). The embedder or LLM they need is passed in."""
