"""A reviewer never sees more than their key could retrieve: items and answers asked with
principals the reviewer's key does not hold stay out of every view."""

from __future__ import annotations

import uuid

import pytest

from rag_service.db.engine import Database
from rag_service.db.repos.reviews import ReviewRepository
from rag_service.domain import Caller
from rag_service.errors import NotFoundError
from rag_service.review.service import ReviewService
from tests.review.seed import seed_answer

PUBLIC_REVIEWER = Caller(key_id=uuid.uuid4(), role="reviewer", principals=())
LEGAL_REVIEWER = Caller(key_id=uuid.uuid4(), role="reviewer", principals=("legal",))


async def test_items_asked_with_other_principals_are_invisible(database: Database) -> None:
    service = ReviewService(ReviewRepository(database), lease_s=60, expire_after_s=86_400, mask=lambda t: t)
    collection = f"scope-{uuid.uuid4().hex[:6]}"
    legal_query, legal_item = await seed_answer(database, collection=collection, principals=["legal"])
    public_query, public_item = await seed_answer(database, collection=collection)

    def ids(page) -> set[uuid.UUID]:  # noqa: ANN001
        return {item.id for item in page.data}

    assert ids(await service.list(PUBLIC_REVIEWER, limit=100)) >= {public_item}
    assert legal_item not in ids(await service.list(PUBLIC_REVIEWER, limit=100))
    assert {legal_item, public_item} <= ids(await service.list(LEGAL_REVIEWER, limit=100))
    with pytest.raises(NotFoundError):
        await service.get(PUBLIC_REVIEWER, legal_item)
    with pytest.raises(NotFoundError):
        await service.claim(PUBLIC_REVIEWER, legal_item)
    with pytest.raises(NotFoundError):
        await service.answer(PUBLIC_REVIEWER, legal_query)
    assert (await service.get(LEGAL_REVIEWER, legal_item)).id == legal_item
    assert (await service.answer(PUBLIC_REVIEWER, public_query)).answer_id == public_query
