"""Fixtures for the review tests that drive the app synchronously (TestClient, CliRunner)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

from rag_service.config import load_settings
from rag_service.db.engine import Database

T = TypeVar("T")
DbRun = Callable[[Callable[[Database], Awaitable[T]]], T]


@pytest.fixture(scope="module")
def db_run(migrated_url: str) -> DbRun:
    """Run ``work(db)`` to completion on a Database of its own, from a synchronous test (the app
    under TestClient runs its event loop in another thread)."""

    def run(work: Callable[[Database], Awaitable[T]]) -> T:
        async def go() -> T:
            db = Database.from_settings(load_settings(database_url=migrated_url), url=migrated_url)
            try:
                return await work(db)
            finally:
                await db.dispose()

        return asyncio.run(go())

    return run
