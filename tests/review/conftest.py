"""Fixtures for the review tests that drive the app synchronously (TestClient, CliRunner)."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

from rag_service.db.engine import Database
from tests.dbrun import run_on

T = TypeVar("T")
DbRun = Callable[[Callable[[Database], Awaitable[T]]], T]


@pytest.fixture(scope="module")
def db_run(migrated_url: str) -> DbRun:
    """``run_on`` bound to this module's database."""
    return functools.partial(run_on, migrated_url)
