"""The chain-of-thought generator: an LLM through the ``openai`` client, structured output
validated with pydantic and retried with the validation error fed back (at most 3 tries), the
answer streamed as it is written, every citation resolved and every cited claim checked. A reply
that cites nothing is the prompt's "the passages do not contain the answer" (outcome no_answer once
the pipeline has checked it against the answerability models: declines.confirm_decline)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from typing import Any, cast

from pydantic import BaseModel, Field, ValidationError, field_validator

from rag_service.domain import Candidate, Citation, GeneratedAnswer
from rag_service.domain.prompts import PromptVersion
from rag_service.errors import ProviderError
from rag_service.pipeline.generation.declines import closest_sources
from rag_service.pipeline.generation.spans import short_answer
from rag_service.pipeline.generation.tokens import TokenSink
from rag_service.prompts.registry import Prompt, PromptRegistry
from rag_service.providers.llm import LLM, Tier
from rag_service.text.citations import best_span, cited_numbers, strip_markers, verify_claims

MAX_TRIES = 3
PROMPT_NAME = "answer_cot"


class LLMAnswer(BaseModel):
    """The reply the prompt asks for."""

    reasoning_steps: list[str] = Field(default_factory=list, max_length=30)
    answer: str = Field(min_length=1, max_length=20_000)
    citations: list[int] = Field(default_factory=list, max_length=100)
    confidence: float = Field(ge=0, le=1)

    @field_validator("citations")
    @classmethod
    def _positive(cls, value: list[int]) -> list[int]:
        if any(n < 1 for n in value):
            raise ValueError("citation numbers start at 1")
        return value


class AnswerFieldStreamer:
    """Feeds on the raw JSON reply as it streams and passes on only the decoded text of its
    ``"answer"`` string, so a client sees prose, not JSON."""

    def __init__(self) -> None:
        self._buffer = ""
        self._state = "seeking"  # seeking -> inside -> done
        self._escape = ""

    def feed(self, piece: str) -> str:
        out: list[str] = []
        for char in piece:
            if self._state == "seeking":
                self._buffer += char
                marker = self._buffer.rfind('"answer"')
                if marker != -1:
                    rest = self._buffer[marker + len('"answer"'):].lstrip()
                    if rest.startswith(":") and rest[1:].lstrip().startswith('"'):
                        self._state, self._buffer = "inside", ""
            elif self._state == "inside":
                if self._escape:
                    self._escape += char
                    if self._escape.startswith("\\u") and len(self._escape) < 6:
                        continue
                    with contextlib.suppress(ValueError):
                        out.append(json.loads(f'"{self._escape}"'))
                    self._escape = ""
                elif char == "\\":
                    self._escape = "\\"
                elif char == '"':
                    self._state = "done"
                else:
                    out.append(char)
        return "".join(out)


def _parse(reply: str) -> LLMAnswer:
    text = reply.strip()
    if text.startswith("```"):
        text = text.strip("`")
        text = text[text.find("{"):]
    start, end = text.find("{"), text.rfind("}")
    if start == -1 or end == -1:
        raise ValueError("the reply holds no JSON object")
    return LLMAnswer.model_validate_json(text[start:end + 1])


class LLMGenerator:
    name = "llm"

    prompt_name = PROMPT_NAME

    def __init__(self, llm: LLM, prompts: PromptRegistry | None = None, max_tries: int = MAX_TRIES) -> None:
        self._llm = llm
        self._prompts = prompts or PromptRegistry()
        self._max_tries = max_tries

    async def generate(self, question: str, sub_questions: Sequence[str], context: Sequence[Candidate], *,
                       tier: Tier = "simple", injection_flagged: bool = False,
                       retrieval_confidence: float | None = None, on_token: TokenSink | None = None,
                       prompt: PromptVersion | None = None) -> GeneratedAnswer:
        """An answer from the LLM with ``prompt``'s template and parameters (default: the shipped
        template). ``retrieval_confidence`` is not used: the model states its own."""
        parameters: dict[str, Any] = prompt.parameters if prompt is not None else {}
        template = (Prompt(prompt.name, prompt.version, prompt.body) if prompt is not None
                    else self._prompts.get(PROMPT_NAME))
        tier = cast(Tier, parameters.get("tier", tier))
        temperature = float(parameters.get("temperature", 0.0))
        max_tokens = int(parameters.get("max_tokens", 1024))
        passages = [{"title": c.hit.title, "source_uri": c.hit.source_uri, "text": c.hit.text} for c in context]
        try:
            messages = template.render(passages=passages, question=question, sub_questions=list(sub_questions),
                                       injection_flagged=injection_flagged)
        except Exception as exc:  # a stored version that fails to render: the extractive fallback answers
            raise ProviderError(f"prompt {template.name} v{template.version} failed to render: {exc}",
                                stage="generator") from exc
        errors: list[str] = []
        for attempt in range(1, self._max_tries + 1):
            if on_token is not None and attempt == 1:
                reply = await self._streamed(messages, tier, on_token, temperature, max_tokens)
            else:
                reply = await self._llm.complete(messages, tier=tier, max_tokens=max_tokens, temperature=temperature,
                                                 json_mode=True)
            try:
                parsed = _parse(reply)
            except (ValidationError, ValueError) as exc:
                errors.append(str(exc).splitlines()[0])
                messages = [*messages, {"role": "assistant", "content": reply[:4000]},
                            {"role": "user", "content": f"That reply was not valid: {exc}. Reply again with only "
                                                        "the JSON object described, fixing this."}]
                continue
            return self._answer(parsed, question, context, template.name, template.version, tier)
        raise ProviderError(f"the LLM gave no valid answer in {self._max_tries} tries: {'; '.join(errors)}",
                            stage="generator")

    async def _streamed(self, messages: list[dict[str, str]], tier: Tier, on_token: TokenSink, temperature: float,
                        max_tokens: int) -> str:
        streamer = AnswerFieldStreamer()
        pieces: list[str] = []
        async for piece in self._llm.stream(messages, tier=tier, max_tokens=max_tokens, temperature=temperature,
                                            json_mode=True):
            pieces.append(piece)
            visible = streamer.feed(piece)
            if visible:
                await on_token(visible)
        return "".join(pieces)

    def _answer(self, parsed: LLMAnswer, question: str, context: Sequence[Candidate], prompt_name: str,
                prompt_version: int, tier: Tier) -> GeneratedAnswer:
        sources = [c.hit.text for c in context]
        claims = verify_claims(parsed.answer, sources)
        cited = [n for n in cited_numbers(parsed.answer) if 1 <= n <= len(context)]
        citations = []
        for n in cited:
            hit = context[n - 1].hit
            citing = [c for c in claims if n in c.citations]
            start, end, quote = best_span(" ".join(c.text for c in citing), hit.text)
            # Verified only when every claim that cites this chunk is supported by it.
            citations.append(Citation(
                n=n, chunk_id=hit.chunk_id, document_id=hit.document_id, source_uri=hit.source_uri, title=hit.title,
                start_char=hit.start_char + start, end_char=hit.start_char + end, quote=quote,
                verified=all(c.verified for c in citing),
            ))
        # The prompt's contract: where the passages do not hold the answer, say so and cite nothing.
        # Such a reply is reported as the extractive abstention is (outcome no_answer, the nearest
        # passages to look at) once the pipeline has checked it (declines.confirm_decline), which
        # may instead read it as an uncited answer: hence its claims and short answer.
        declined = not cited_numbers(parsed.answer) and not parsed.citations
        return GeneratedAnswer(
            answer=parsed.answer, short_answer=short_answer(question, strip_markers(parsed.answer), parsed.confidence),
            citations=citations,
            claims=claims, confidence=parsed.confidence, reasoning_steps=parsed.reasoning_steps, generator="llm",
            model=self._llm.model_for(tier), prompt_name=prompt_name, prompt_version=prompt_version,
            answered=not declined, closest_sources=closest_sources(context) if declined else [],
        )
