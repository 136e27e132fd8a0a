"""Router guidelines (condition -> route, by priority) and the decision the router records."""

from __future__ import annotations

from typing import Literal

import regex
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rag_service.domain.intent import Complexity, QueryType
from rag_service.domain.strategies import StrategyName

# Guideline regexes come from users (PUT /v1/guidelines) and run on every question: a pattern
# with catastrophic backtracking must not stall the service, so matching is time-limited.
REGEX_TIMEOUT_S = 0.02


class Condition(BaseModel):
    """All given fields must hold (an empty condition always matches)."""

    model_config = ConfigDict(extra="forbid")

    query_types: list[QueryType] | None = None
    complexity: list[Complexity] | None = None
    min_ambiguity: float | None = Field(default=None, ge=0, le=1)
    has_identifiers: bool | None = None
    has_quoted: bool | None = None
    has_time_range: bool | None = None
    min_sub_questions: int | None = Field(default=None, ge=0)
    needs_clarification: bool | None = Field(
        default=None, description="The intent parser found the question too ambiguous to answer "
                                  "(RAGSVC_CLARIFY_AMBIGUITY_THRESHOLD).")
    question_matches: str | None = Field(
        default=None, max_length=500,
        description="A regex (Python syntax, `regex` module); matching is limited to 20 ms per question.")

    @field_validator("question_matches")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                compiled = regex.compile(value)
                # Refuse at once what would already time out on a short adversarial input.
                compiled.search("a" * 64 + "!" + " x" * 64, timeout=REGEX_TIMEOUT_S * 5)
            except regex.error as exc:
                raise ValueError(f"question_matches is not a valid regex: {exc}") from None
            except TimeoutError:
                raise ValueError("question_matches backtracks catastrophically; simplify it") from None
        return value


class RouteSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    action: Literal["answer", "clarify", "decline"] = "answer"
    strategies: list[StrategyName] | None = Field(default=None, min_length=1)
    top_k: int | None = Field(default=None, ge=1, le=50)
    rerank: bool | None = None
    adaptive: bool | None = None
    tier: Complexity | None = Field(default=None, description="LLM model tier; default: the intent's complexity.")
    use_time_filter: bool = Field(default=False, description="Filter documents by the question's time range.")
    split_parts: bool = Field(default=False, description="Retrieve for each sub-question separately.")


class Guideline(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=100, pattern=r"^[a-z0-9][a-z0-9_-]*$")
    priority: int = Field(ge=0, le=100_000)
    description: str = ""
    when: Condition = Field(default_factory=Condition)
    route: RouteSpec


class GuidelineSet(BaseModel):
    model_config = ConfigDict(extra="forbid")

    guidelines: list[Guideline] = Field(max_length=500)
    fallback: RouteSpec = Field(default_factory=RouteSpec)

    @model_validator(mode="after")
    def _unique_names(self) -> GuidelineSet:
        names = [g.name for g in self.guidelines]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"guideline names must be unique; repeated: {duplicates}")
        if self.fallback.action != "answer":
            raise ValueError("the fallback route must answer")
        return self


class ResolvedRoute(BaseModel):
    action: Literal["answer", "clarify", "decline"]
    strategies: list[str]
    top_k: int
    rerank: bool | None
    adaptive: bool | None
    tier: Complexity
    use_time_filter: bool
    split_parts: bool


class RouteDecision(BaseModel):
    guideline: str | None = Field(description="The guideline that matched; null = the fallback route.")
    reasons: list[str]
    confidence: float = Field(ge=0, le=1)
    route: ResolvedRoute
    guidelines_version: int | None = None
