"""Fixtures for the scoring tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fake_openai import FakeOpenAI, fake_openai


@pytest.fixture(scope="module")
def shared_server() -> Iterator[FakeOpenAI]:
    with fake_openai() as server:
        yield server


@pytest.fixture
def server(shared_server: FakeOpenAI) -> FakeOpenAI:
    """One server for the module (stopping one takes half a second), emptied for each test."""
    shared_server.reset()
    return shared_server

