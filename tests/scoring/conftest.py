"""Fixtures for the scoring tests: one fake OpenAI server per module."""

from tests.fake_openai import server, shared_server  # noqa: F401 (fixtures)
