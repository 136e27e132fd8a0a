"""What the orchestrator is built over: one small Protocol per collaborator, so it can be
assembled from the real parts (runtime.py) or from ten-line fakes in a unit test."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from rag_service.domain import (
    Candidate,
    Complexity,
    EvaluationReport,
    GeneratedAnswer,
    GuidelineSet,
    QueryLogEntry,
    QueryResult,
    QueryTrace,
    RetrievalRequest,
    RetrievalResult,
    ReviewTrigger,
    Turn,
)
from rag_service.domain.prompts import PromptChoice, PromptVersion
from rag_service.pipeline.generation.tokens import TokenSink


@runtime_checkable
class Retrieves(Protocol):
    async def retrieve(self, request: RetrievalRequest) -> RetrievalResult: ...


@runtime_checkable
class AnswerGenerator(Protocol):
    name: str
    prompt_name: str  # the prompt whose versions it reads

    async def generate(self, question: str, sub_questions: Sequence[str], context: Sequence[Candidate], *,
                       tier: Complexity = "simple", injection_flagged: bool = False,
                       retrieval_confidence: float | None = None,
                       on_token: TokenSink | None = None, prompt: PromptVersion | None = None) -> GeneratedAnswer:
        """An answer citing ``context`` as [n] (1-based); its text also goes to ``on_token``.
        ``prompt``: the version of its prompt to use (None: its shipped default)."""
        ...


@runtime_checkable
class PromptSource(Protocol):
    async def choose(self, name: str, unit: str) -> PromptChoice:
        """The version of prompt ``name`` a query uses: production, or under a running experiment
        the variant drawn for ``unit`` (the conversation, else the API key, else the query)."""
        ...


@runtime_checkable
class QueryHistory(Protocol):
    async def turns(self, conversation_id: str, collection: str, principals: Sequence[str],
                    limit: int = 5) -> list[Turn]:
        """The conversation's last turns, oldest first (none when it is someone else's)."""
        ...

    async def record(self, entry: QueryLogEntry) -> None: ...

    async def record_grades(self, query_id: uuid.UUID, *, collection: str, question_hash: str | None,
                            report: EvaluationReport, trigger: ReviewTrigger | None, prompt_name: str | None,
                            prompt_version: int | None) -> None:
        """Grades that arrived after the answer (the LLM judge's), queueing it when they ask to."""
        ...


@runtime_checkable
class GuidelineSource(Protocol):
    async def current(self) -> tuple[int, GuidelineSet]:
        """The current guidelines and their version."""
        ...


@runtime_checkable
class CollectionCatalog(Protocol):
    async def collection_exists(self, name: str) -> bool: ...


class QueryObserver(Protocol):
    def __call__(self, collection: str, result: QueryResult) -> None:
        """Told of every finished query (the service's metrics); must not raise or block."""
        ...


class TraceSink(Protocol):
    async def record_trace(self, trace: QueryTrace) -> None:
        """Store a finished query's trace."""
        ...

    async def record_evaluation(self, query_id: uuid.UUID, report: EvaluationReport) -> None:
        """Replace a stored trace's evaluation (the late LLM grades)."""
        ...
