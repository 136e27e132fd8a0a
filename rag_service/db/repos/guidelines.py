"""The router's guidelines: versions of kind ``guidelines`` (name ``router``) in the prompt
versions, the one labelled ``production`` current. Reads are cached by ``PromptRepository`` and a
new version reaches every process at once (LISTEN/NOTIFY)."""

from __future__ import annotations

from typing import Any

from rag_service.db.repos.prompts import PromptRepository
from rag_service.domain import GuidelineSet
from rag_service.domain.prompts import GUIDELINES_NAME, PRODUCTION


class GuidelineRepository:
    def __init__(self, prompts: PromptRepository) -> None:
        self._prompts = prompts

    async def current(self) -> tuple[int, GuidelineSet]:
        version = await self._prompts.by_label("guidelines", GUIDELINES_NAME, PRODUCTION)
        return version.version, GuidelineSet.model_validate_json(version.body)

    async def put(self, guidelines: GuidelineSet, comment: str | None, author: str | None) -> int:
        """A new version, labelled production at once (PUT /v1/guidelines)."""
        current = await self._prompts.by_label("guidelines", GUIDELINES_NAME, PRODUCTION)
        created = await self._prompts.create(
            "guidelines", GUIDELINES_NAME, body=guidelines.model_dump_json(indent=2, exclude_none=True),
            parameters={}, author=author, source="manual", note=comment, parent_version=current.version,
            label=PRODUCTION)
        return created.version

    async def versions(self, limit: int = 20) -> list[dict[str, Any]]:
        found, _ = await self._prompts.versions("guidelines", GUIDELINES_NAME, limit=limit)
        return [{"version": v.version, "comment": v.note, "created_by": v.author, "created_at": v.created_at,
                 "labels": v.labels} for v in found]
