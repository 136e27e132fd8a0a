"""Fixtures for the evaluation tests: one fake OpenAI server per module (the LLM-judged ragas metrics)."""

from tests.fake_openai import server, shared_server  # noqa: F401 (fixtures)
