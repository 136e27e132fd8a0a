"""The collaborators an evaluation run gives the query pipeline instead of the live ones.

- Prompts: production, or the version the run pins; never a running experiment's draw (an offline
  run measures one configuration, not a traffic split).
- Guidelines: production, or the pinned version.
- History: nothing is stored. An eval answer is not a user's answer: it must not enter the query
  log, the review queue or an experiment's observations. Grades the LLM judge delivers late are
  kept in memory for the runner to pick up.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from rag_service.db.repos.prompts import PromptRepository
from rag_service.domain import EvaluationReport, GuidelineSet, QueryLogEntry, ReviewTrigger, Turn
from rag_service.domain.prompts import GUIDELINES_NAME, PRODUCTION, PromptChoice

GUIDELINES_PIN = "guidelines"  # the key of EvalRunRequest.prompts that pins the router's guidelines


def pinnable(answer_prompt: str) -> frozenset[str]:
    """What an eval run can answer with another version of: the configured answering prompt and the
    guidelines (so also what the promotion gate can judge)."""
    return frozenset({answer_prompt, GUIDELINES_PIN})


class PinnedPrompts:
    def __init__(self, repository: PromptRepository, pins: dict[str, int]) -> None:
        self._repository = repository
        self._pins = {name: version for name, version in pins.items() if name != GUIDELINES_PIN}

    async def choose(self, name: str, unit: str) -> PromptChoice:
        if name in self._pins:
            return PromptChoice(version=await self._repository.pinned("prompt", name, self._pins[name]))
        return PromptChoice(version=await self._repository.by_label("prompt", name, PRODUCTION))

    async def resolved(self, names: Sequence[str]) -> dict[str, int]:
        """The version each named prompt is answered with in this run (for the run record)."""
        return {name: (await self.choose(name, "")).version.version for name in names}


class PinnedGuidelines:
    def __init__(self, repository: PromptRepository, version: int | None) -> None:
        self._repository = repository
        self._version = version

    async def current(self) -> tuple[int, GuidelineSet]:
        if self._version is None:
            found = await self._repository.by_label("guidelines", GUIDELINES_NAME, PRODUCTION)
        else:
            found = await self._repository.pinned("guidelines", GUIDELINES_NAME, self._version)
        return found.version, GuidelineSet.model_validate_json(found.body)


class EvalHistory:
    """A query history that stores nothing: no conversation turns, no log, no review items."""

    def __init__(self) -> None:
        self.late_grades: dict[uuid.UUID, EvaluationReport] = {}

    async def turns(self, conversation_id: str, collection: str, principals: Sequence[str],
                    limit: int = 5) -> list[Turn]:
        return []

    async def record(self, entry: QueryLogEntry) -> None:
        return None

    async def record_grades(self, query_id: uuid.UUID, *, collection: str, question_hash: str | None,
                            report: EvaluationReport, trigger: ReviewTrigger | None, prompt_name: str | None,
                            prompt_version: int | None) -> None:
        self.late_grades[query_id] = report
