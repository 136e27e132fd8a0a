"""Fixtures for the reviewer console's tests: API keys, a review item whose answer cites a
passage, and app settings whose data folder shares the session's model cache (the app loads the
embedding model when it starts, and the export is worth doing once)."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from rag_service.config import Settings, load_settings
from rag_service.db.engine import Database
from rag_service.db.repos import ApiKeyRepository
from rag_service.domain import Role
from tests.conftest import scratch_dir
from tests.dbrun import run_on
from tests.review.seed import add_chunk, citation, seed_answer

QUESTION = "How do I reset my password?"
PASSAGE = ("Passwords expire every ninety days. Reset it from the settings page. "
           "The reset link in the e-mail is valid for one hour.")
QUOTE = "Reset it from the settings page."
PROMPT = "answer_extractive"  # version 1 and its production label exist after migration 0006


@pytest.fixture(scope="module")
def console_data_dir(model_cache: Path) -> Iterator[Path]:
    path = scratch_dir("ragsvc-console-")
    (path / "models").symlink_to(model_cache, target_is_directory=True)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def console_settings(url: str, data_dir: Path) -> Settings:
    return load_settings(database_url=url, data_dir=data_dir, serve_worker="off")


def create_key(url: str, role: Role, name: str) -> str:
    return run_on(url, lambda db: ApiKeyRepository(db).create(role, name=name))[1]


def revoke_key(url: str, key: str) -> None:
    run_on(url, lambda db: ApiKeyRepository(db).revoke(key))


async def seed_review_item(db: Database, question: str = QUESTION,
                           reason: str = "faithfulness: 0.40 < 0.80") -> uuid.UUID:
    """A queued extractive answer citing [1], a passage that exists, with the quoted span in it."""
    chunk_id, document_id = await add_chunk(db, "kb", PASSAGE)
    _, review_id = await seed_answer(
        db, collection="kb", question=question, question_hash=uuid.uuid4().hex, overall=0.42, tier="high",
        metrics={"faithfulness": 0.4, "relevance": 0.9}, flagged=["faithfulness"],
        reasons=[reason], prompt_name=PROMPT, prompt_version=1,
        answer=f"{QUOTE} [1]", citations=[citation(1, chunk_id, document_id, QUOTE, PASSAGE.find(QUOTE))],
        context=[{"n": 1, "chunk_id": str(chunk_id), "score": 0.82}])
    assert review_id is not None
    return review_id
