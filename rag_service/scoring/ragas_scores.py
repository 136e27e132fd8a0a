"""ragas (0.4.x) Faithfulness and ResponseRelevancy on the service's OpenAI-compatible endpoint.

ragas is optional (the ``ragas`` extra) and slow to import (~3-5 s: langchain, datasets), so it
is imported on first use, in a worker thread. Without it, nothing is scored and a note says why.

Per answer ragas makes 2 + ``strictness`` chat calls, all JSON mode through instructor (which
re-asks once, ``RagasConfig.retries``, when a reply does not fit its output model):
- Faithfulness: one call splits the answer into statements, one judges each statement against
  the joined contexts (verdict 0/1); the value is the share of supported statements.
- ResponseRelevancy: ``strictness`` sequential calls each generate a question from the answer
  (and flag a noncommittal answer); the value is the mean cosine between those questions and the
  real one, 0 when every call called the answer noncommittal. In 0.4 this metric lives in
  ``ragas.metrics.collections`` as ``AnswerRelevancy`` (``ResponseRelevancy`` is the deprecated
  legacy class of the same metric); the scorer keeps the ``ResponseRelevancy`` name.
The embeddings are our own embedder's (``embed``), wrapped as a ragas embedding: no second endpoint.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from functools import cache
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from rag_service.domain import MetricName, MetricScore
from rag_service.scoring.evidence import ScoringInput
from rag_service.text.citations import strip_markers

if TYPE_CHECKING:
    from rag_service.config import Settings

FAITHFULNESS_SCORER = "ragas:Faithfulness"
RELEVANCY_SCORER = "ragas:ResponseRelevancy"
RAGAS_PREFIX = "ragas:"
RAGAS_METRICS: tuple[MetricName, ...] = ("faithfulness", "relevance")


class Embed(Protocol):
    """Our embedder's ``embed``: one (L2-normalised) row per text."""

    def __call__(self, texts: Sequence[str], /) -> Awaitable[np.ndarray]: ...


@dataclass(frozen=True)
class RagasConfig:
    """The OpenAI-compatible endpoint ragas calls (the same one the generator and judge use)."""

    base_url: str
    model: str
    api_key: str | None = None
    strictness: int = 3  # questions ResponseRelevancy generates per answer
    retries: int = 1  # times instructor re-asks after a reply that does not fit the output model
    max_tokens: int = 1024

    def __post_init__(self) -> None:
        if not self.base_url.strip() or not self.model.strip():
            raise ValueError("ragas needs the LLM endpoint's base_url and a model name")
        if self.strictness < 1:
            raise ValueError("strictness must be >= 1 (questions generated per answer)")
        if self.retries < 0:
            raise ValueError("retries must be >= 0")

    @classmethod
    def from_settings(cls, settings: Settings) -> RagasConfig | None:
        """From the LLM settings; None when no LLM is configured or ragas grading is switched off."""
        if not settings.llm_base_url or not settings.eval_ragas:
            return None
        key = settings.llm_api_key.get_secret_value() if settings.llm_api_key else None
        return cls(base_url=settings.llm_base_url, model=settings.llm_model_simple, api_key=key)


@dataclass(frozen=True)
class RagasResult:
    scores: list[MetricScore] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@cache
def _load() -> SimpleNamespace:
    """ragas and what it needs; ImportError when the extra is not installed (not cached: a later
    install is picked up)."""
    # ragas sends usage analytics unless told not to; a user's own setting wins.
    os.environ.setdefault("RAGAS_DO_NOT_TRACK", "true")
    from openai import AsyncOpenAI
    from ragas.embeddings.base import BaseRagasEmbedding
    from ragas.llms.base import llm_factory
    from ragas.metrics.collections import AnswerRelevancy, Faithfulness

    class EmbedderEmbeddings(BaseRagasEmbedding):
        """Our embedder as a ragas embedding (async only: the metrics call ``aembed_*``)."""

        def __init__(self, embed: Embed) -> None:
            super().__init__(cache=None)
            self._embed = embed

        def embed_text(self, text: str, **kwargs: Any) -> list[float]:
            raise TypeError("this embedding is async only; use aembed_text")

        async def aembed_text(self, text: str, **kwargs: Any) -> list[float]:
            return (await self.aembed_texts([text]))[0]

        async def aembed_texts(self, texts: list[str], **kwargs: Any) -> list[list[float]]:
            vectors = np.asarray(await self._embed(list(texts)), dtype=np.float64)
            return vectors.reshape(len(texts), -1).tolist()

    return SimpleNamespace(AsyncOpenAI=AsyncOpenAI, llm_factory=llm_factory, Faithfulness=Faithfulness,
                           AnswerRelevancy=AnswerRelevancy, Embeddings=EmbedderEmbeddings)


async def load_ragas() -> SimpleNamespace | str:
    """The loaded ragas pieces, or why they are unavailable."""
    try:
        return await asyncio.to_thread(_load)
    except ImportError as exc:
        return f"ragas is not installed (pip install 'rag-service[ragas]'): {exc}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]


def _unit(value: float) -> float:
    return min(1.0, max(0.0, value))


async def _faithfulness(ragas: SimpleNamespace, llm: Any, question: str, answer: str,
                        contexts: list[str]) -> MetricScore | str:
    result = await ragas.Faithfulness(llm=llm).ascore(user_input=question, response=answer,
                                                      retrieved_contexts=contexts)
    if result.value is None or math.isnan(result.value):
        return "ragas Faithfulness found no statements to check in the answer"
    value = _unit(float(result.value))
    return MetricScore(metric="faithfulness", value=value, scorer=FAITHFULNESS_SCORER,
                       reason=f"{value:.0%} of the answer's statements can be inferred from the contexts")


async def _relevancy(ragas: SimpleNamespace, llm: Any, embed: Embed, question: str, answer: str,
                     strictness: int) -> MetricScore | str:
    metric = ragas.AnswerRelevancy(llm=llm, embeddings=ragas.Embeddings(embed), strictness=strictness)
    result = await metric.ascore(user_input=question, response=answer)
    if result.value is None or math.isnan(result.value):
        return "ragas ResponseRelevancy returned no value"
    value = _unit(float(result.value))
    reason = (f"questions generated from the answer have a mean cosine of {value:.2f} with the question"
              if value > 0 else "the answer is noncommittal, or the questions it answers are unrelated")
    return MetricScore(metric="relevance", value=value, scorer=RELEVANCY_SCORER, reason=reason)


async def ragas_scores(inp: ScoringInput, config: RagasConfig, *, embed: Embed | None,
                       budget_s: float) -> RagasResult:
    """Faithfulness and ResponseRelevancy, concurrently, within ``budget_s`` seconds. Never raises
    for a grading failure: what could not be scored is left out, with a note."""
    if budget_s <= 0:
        raise ValueError("budget_s must be > 0 (seconds ragas may take)")
    answer = strip_markers(inp.answer)
    question = inp.question.strip()
    if not answer or not question:
        return RagasResult(notes=["ragas skipped: the question or the answer is empty"])
    contexts = [c.text for c in inp.contexts if c.text.strip()]
    notes: list[str] = []
    if not contexts:
        notes.append("ragas Faithfulness skipped: no contexts to check the answer against")
    if embed is None:
        notes.append("ragas ResponseRelevancy skipped: no embedder was given")
    if not contexts and embed is None:
        return RagasResult(notes=notes)

    deadline = asyncio.get_running_loop().time() + budget_s
    try:
        ragas = await asyncio.wait_for(load_ragas(), budget_s)
    except TimeoutError:  # the import goes on in its thread; a later call finds it loaded
        return RagasResult(notes=[*notes, f"ragas did not load within {budget_s:g} s"])
    if isinstance(ragas, str):
        return RagasResult(notes=[*notes, ragas])

    async with ragas.AsyncOpenAI(base_url=config.base_url, api_key=config.api_key or "unused",
                                 timeout=budget_s, max_retries=0) as client:
        try:
            # max_retries goes to instructor's create(): the number of attempts after the first.
            llm = ragas.llm_factory(config.model, client=client, max_tokens=config.max_tokens,
                                    max_retries=config.retries)
        except Exception as exc:  # ragas wraps a client it cannot use in ValueError
            return RagasResult(notes=[*notes, f"ragas could not use the LLM endpoint: {_first_line(exc)}"])
        jobs: dict[str, Awaitable[MetricScore | str]] = {}
        if contexts:
            jobs["Faithfulness"] = _faithfulness(ragas, llm, question, answer, contexts)
        if embed is not None:
            jobs["ResponseRelevancy"] = _relevancy(ragas, llm, embed, question, answer, config.strictness)
        tasks = {name: asyncio.ensure_future(job) for name, job in jobs.items()}
        try:
            await asyncio.wait(tasks.values(), timeout=max(0.0, deadline - asyncio.get_running_loop().time()))
        finally:
            # On time-out, or when the caller is cancelled: stop the calls before the client closes.
            for task in tasks.values():
                task.cancel()
            await asyncio.gather(*tasks.values(), return_exceptions=True)
    scores: list[MetricScore] = []
    for name, task in tasks.items():
        if task.cancelled():
            notes.append(f"ragas {name} timed out after {budget_s:g} s")
        elif (exc := task.exception()) is not None:
            notes.append(f"ragas {name} failed: {type(exc).__name__}: {_first_line(exc)}")
        elif isinstance(outcome := task.result(), str):
            notes.append(outcome)
        else:
            scores.append(outcome)
    return RagasResult(scores=scores, notes=notes)
