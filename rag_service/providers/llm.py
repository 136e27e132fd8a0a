"""LLMs: a Protocol and an OpenAI-compatible chat client (OpenAI, Azure, vLLM, Ollama, llama.cpp...).

The service works without an LLM; ``make_llm`` returns None when ``RAGSVC_LLM_BASE_URL`` is unset,
and every caller has a rule-based path for that case. Errors surface as ProviderError so callers
can fall back (and record why) instead of failing the request.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Literal, Protocol, runtime_checkable

from rag_service.config import Settings
from rag_service.errors import ProviderError

Tier = Literal["simple", "moderate", "complex"]
Message = dict[str, str]

# The token counts of the calls made inside ``metered()`` (this task and the tasks it starts).
_meter: ContextVar[dict[str, int] | None] = ContextVar("llm_token_meter", default=None)


@contextmanager
def metered(counts: dict[str, int] | None = None) -> Iterator[dict[str, int]]:
    """Count the tokens of the LLM calls made inside into ``counts`` (a new dict by default):
    ``{"prompt": n, "completion": m}`` as the server reported them (empty when it reported none).
    Calls that fail later (a reply that does not parse) are counted too: they were paid for."""
    counts = {} if counts is None else counts
    token = _meter.set(counts)
    try:
        yield counts
    finally:
        _meter.reset(token)


def _record(usage: Any) -> None:
    counts = _meter.get()
    if counts is None or usage is None:
        return
    for key, field in (("prompt", "prompt_tokens"), ("completion", "completion_tokens")):
        value = getattr(usage, field, None)
        if isinstance(value, int):
            counts[key] = counts.get(key, 0) + value


@runtime_checkable
class LLM(Protocol):
    def model_for(self, tier: Tier) -> str: ...

    async def complete(self, messages: Sequence[Message], *, tier: Tier = "simple", max_tokens: int = 512,
                       temperature: float = 0.0, json_mode: bool = False) -> str:
        """The assistant's reply text."""
        ...

    async def stream(self, messages: Sequence[Message], *, tier: Tier = "simple", max_tokens: int = 1024,
                     temperature: float = 0.0, json_mode: bool = False) -> AsyncIterator[str]:
        """The reply as it is generated, piece by piece."""
        ...


class OpenAICompatibleLLM:
    def __init__(self, *, base_url: str, api_key: str | None, models: dict[Tier, str], timeout_s: float = 30.0,
                 max_retries: int = 0) -> None:
        from openai import AsyncOpenAI

        # Retries belong to the caller, which knows its time budget.
        self._client = AsyncOpenAI(base_url=base_url, api_key=api_key or "unused", timeout=timeout_s,
                                   max_retries=max_retries)
        self._models = models

    def model_for(self, tier: Tier) -> str:
        return self._models[tier]

    async def complete(self, messages: Sequence[Message], *, tier: Tier = "simple", max_tokens: int = 512,
                       temperature: float = 0.0, json_mode: bool = False) -> str:
        from openai import OpenAIError

        extra = {"response_format": {"type": "json_object"}} if json_mode else {}
        try:
            response = await self._client.chat.completions.create(
                model=self._models[tier], messages=list(messages), max_tokens=max_tokens, temperature=temperature,
                **extra,
            )
        except OpenAIError as exc:
            raise ProviderError(f"LLM request to {self._client.base_url} failed: {type(exc).__name__}: {exc}",
                                stage="llm") from exc
        _record(response.usage)
        if not response.choices or response.choices[0].message.content is None:
            raise ProviderError("LLM returned no content", stage="llm")
        return response.choices[0].message.content

    async def stream(self, messages: Sequence[Message], *, tier: Tier = "simple", max_tokens: int = 1024,
                     temperature: float = 0.0, json_mode: bool = False) -> AsyncIterator[str]:
        from openai import OpenAIError

        extra = {"response_format": {"type": "json_object"}} if json_mode else {}
        try:
            response = await self._client.chat.completions.create(
                model=self._models[tier], messages=list(messages), max_tokens=max_tokens, temperature=temperature,
                # The last chunk then carries the token counts (OpenAI, vLLM, Ollama, llama.cpp).
                stream=True, stream_options={"include_usage": True}, **extra,
            )
            async for chunk in response:
                _record(getattr(chunk, "usage", None))
                if chunk.choices and chunk.choices[0].delta.content:
                    yield chunk.choices[0].delta.content
        except OpenAIError as exc:
            raise ProviderError(f"LLM stream from {self._client.base_url} failed: {type(exc).__name__}: {exc}",
                                stage="llm") from exc

    async def close(self) -> None:
        await self._client.close()


def make_llm(settings: Settings) -> OpenAICompatibleLLM | None:
    """The configured LLM, or None when no endpoint is set (the rule-based paths are then used)."""
    if not settings.llm_base_url:
        return None
    return OpenAICompatibleLLM(
        base_url=settings.llm_base_url,
        api_key=settings.llm_api_key.get_secret_value() if settings.llm_api_key else None,
        models={"simple": settings.llm_model_simple, "moderate": settings.llm_model_moderate,
                "complex": settings.llm_model_complex},
        timeout_s=settings.llm_timeout_s,
    )
