"""Running async database work from synchronous tests (the app under TestClient runs its event
loop in another thread, so such tests drive the database on a loop of their own)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from rag_service.config import load_settings
from rag_service.db.engine import Database

T = TypeVar("T")


def run_on(url: str, work: Callable[[Database], Awaitable[T]]) -> T:
    """``work(db)`` run to completion on a Database of its own for ``url``."""

    async def go() -> T:
        db = Database.from_settings(load_settings(database_url=url), url=url)
        try:
            return await work(db)
        finally:
            await db.dispose()

    return asyncio.run(go())
