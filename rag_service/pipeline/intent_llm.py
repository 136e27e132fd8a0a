"""When the rules are unsure of a question's type and an LLM is configured, ask it: the query
type and the sub-questions, as JSON. Anything the LLM gets wrong is dropped; the rules' answer
stands for everything else (entities, time ranges, ambiguity are always the rules')."""

from __future__ import annotations

import json
from typing import get_args

from rag_service.errors import ProviderError
from rag_service.pipeline.intent import RULES_UNSURE_BELOW, Intent, QueryType
from rag_service.providers.llm import LLM

__all__ = ["RULES_UNSURE_BELOW", "refine_with_llm"]
_TYPES = get_args(QueryType)
_PROMPT = (
    "Classify the user's question for a document search system. Reply with JSON only: "
    '{"query_type": one of ' + ", ".join(_TYPES) + ', "sub_questions": [the separate questions it asks, '
    "or [] if it asks one thing]}"
)


async def refine_with_llm(intent: Intent, llm: LLM) -> Intent:
    """The intent with the LLM's query type and sub-questions (or unchanged when its reply is unusable)."""
    reply = await llm.complete([{"role": "system", "content": _PROMPT}, {"role": "user", "content": intent.question}],
                               json_mode=True, max_tokens=300)
    try:
        data = json.loads(reply)
        query_type = data["query_type"]
        subs = data.get("sub_questions") or []
        if not isinstance(subs, list):
            raise TypeError("sub_questions is not a list")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ProviderError(f"LLM intent reply was not the JSON asked for: {reply[:200]!r}", stage="intent") from exc
    if query_type not in _TYPES:
        raise ProviderError(f"LLM intent reply names an unknown query type {query_type!r}", stage="intent")
    subs = [s.strip()[:500] for s in subs if isinstance(s, str) and s.strip()][:6]
    return intent.model_copy(update={
        "query_type": query_type, "sub_questions": subs if len(subs) >= 2 else intent.sub_questions,
        "parsed_by": "rules+llm", "confidence": max(intent.confidence, 0.6),
    })
