"""What an answer's LLM generation cost, from the tokens the endpoint reported and the configured prices."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Prices:
    """USD per 1,000 tokens (RAGSVC_LLM_USD_PER_1K_*); None: not configured."""

    prompt: float | None = None
    completion: float | None = None


def generation_cost(generator: str | None, tokens: Mapping[str, int] | None, prices: Prices) -> float | None:
    """0 without an LLM call (an extractive answer); None when the LLM's tokens or the prices are unknown."""
    if not tokens:
        return 0.0 if generator == "extractive" else None
    if prices.prompt is None or prices.completion is None:
        return None
    return (tokens.get("prompt", 0) * prices.prompt + tokens.get("completion", 0) * prices.completion) / 1000
