"""LLM query expansion for the adaptive loop: rewritten queries and HyDE (a hypothetical answer
passage, embedded instead of the question; Gao et al., 2022). Used only when an LLM is configured;
the loop's rule-based rewrites need none."""

from __future__ import annotations

import json

from rag_service.errors import ProviderError
from rag_service.providers.llm import LLM

MAX_VARIANTS = 3

_VARIANTS_PROMPT = (
    "Rewrite the user's search query into {n} different search queries that could find the answer in a "
    "document collection: use synonyms, expand abbreviations, name the likely terminology. "
    'Reply with JSON only: {{"queries": ["...", "..."]}}'
)
_HYDE_PROMPT = (
    "Write one short factual passage (2-4 sentences) that would answer the question, as it might appear in "
    "a reference document. Reply with the passage only."
)


class LLMQueryExpander:
    def __init__(self, llm: LLM) -> None:
        self._llm = llm

    async def variants(self, query: str, n: int = MAX_VARIANTS) -> list[str]:
        reply = await self._llm.complete(
            [{"role": "system", "content": _VARIANTS_PROMPT.format(n=n)}, {"role": "user", "content": query}],
            json_mode=True, max_tokens=300,
        )
        try:
            queries = json.loads(reply)["queries"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ProviderError(f"LLM query variants were not the JSON asked for: {reply[:200]!r}",
                                stage="query expansion") from exc
        if not isinstance(queries, list):
            raise ProviderError("LLM query variants: 'queries' is not a list", stage="query expansion")
        seen = {query.strip().lower()}
        out = []
        for item in queries:
            if isinstance(item, str) and item.strip() and item.strip().lower() not in seen:
                seen.add(item.strip().lower())
                out.append(item.strip()[:500])
        return out[:n]

    async def hypothetical_document(self, query: str) -> str:
        passage = await self._llm.complete(
            [{"role": "system", "content": _HYDE_PROMPT}, {"role": "user", "content": query}], max_tokens=200,
        )
        if not passage.strip():
            raise ProviderError("LLM returned an empty hypothetical passage", stage="query expansion")
        return passage.strip()[:2000]
