"""Answer generation: extractive (no LLM) and chain-of-thought with an LLM, with verified citations."""
