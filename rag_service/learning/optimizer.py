"""The design's analyse-feedback -> optimise-prompts step: with an LLM configured, reviewers'
feedback texts rewrite a template (the ``prompt_optimizer`` prompt). The result is only a
candidate: it must pass template validation, and then an experiment, before it serves traffic."""

from __future__ import annotations

import textwrap
from collections.abc import Awaitable, Callable, Sequence

from rag_service.prompts.registry import Prompt
from rag_service.providers.llm import LLM

PROMPT_NAME = "prompt_optimizer"
MAX_FEEDBACK = 20
MAX_FEEDBACK_CHARS = 500

Rewrite = Callable[[str, Sequence[str]], Awaitable[str]]


def rewriter(llm: LLM, prompt: Callable[[], Awaitable[Prompt]]) -> Rewrite:
    """``prompt`` gives the optimizer template to use (the production version of ``prompt_optimizer``)."""

    async def rewrite(template: str, feedback: Sequence[str]) -> str:
        texts = [textwrap.shorten(" ".join(t.split()), MAX_FEEDBACK_CHARS, placeholder="...")
                 for t in feedback[:MAX_FEEDBACK]]
        messages = (await prompt()).render(template=template, feedback=texts)
        reply = await llm.complete(messages, tier="complex", max_tokens=4096, temperature=0.2)
        reply = reply.strip()
        if reply.startswith("<<<") and reply.endswith(">>>"):
            reply = reply[3:-3].strip()
        return reply.strip("`").strip()

    return rewrite
