"""The query pipeline (guardrails, intent, routing, retrieval, generation, evaluation): later issues."""
