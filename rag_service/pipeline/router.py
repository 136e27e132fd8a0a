"""The rule-based Router: guidelines are data (condition -> route, priority), the decision is a
pure function of the intent and the guideline set, and "no guideline matched" is a decision too."""

from __future__ import annotations

from importlib import resources
from typing import Literal

import regex
import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rag_service.pipeline.intent import Complexity, Intent, QueryType
from rag_service.pipeline.retrieval.models import StrategyName

DEFAULT_STRATEGIES: list[StrategyName] = ["semantic", "keyword", "pattern", "metadata"]
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
    strategies: list[StrategyName]
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


def default_guidelines() -> GuidelineSet:
    text = resources.files("rag_service.pipeline").joinpath("guidelines.yaml").read_text(encoding="utf-8")
    return GuidelineSet.model_validate(yaml.safe_load(text))


def _reasons(when: Condition, intent: Intent) -> list[str] | None:
    """Why each condition holds, or None when one does not."""
    reasons: list[str] = []
    if when.query_types is not None:
        if intent.query_type not in when.query_types:
            return None
        reasons.append(f"query type is {intent.query_type}")
    if when.complexity is not None:
        if intent.complexity not in when.complexity:
            return None
        reasons.append(f"complexity is {intent.complexity}")
    if when.min_ambiguity is not None:
        if intent.ambiguity < when.min_ambiguity:
            return None
        reasons.append(f"ambiguity {intent.ambiguity} >= {when.min_ambiguity}")
    for flag, present, label in (
        (when.has_identifiers, bool(intent.entities.identifiers), "identifiers"),
        (when.has_quoted, bool(intent.entities.quoted), "quoted phrases"),
        (when.has_time_range, bool(intent.time_ranges), "a time range"),
    ):
        if flag is not None:
            if flag != present:
                return None
            reasons.append(f"{'has' if present else 'has no'} {label}")
    if when.min_sub_questions is not None:
        if len(intent.sub_questions) < when.min_sub_questions:
            return None
        reasons.append(f"{len(intent.sub_questions)} sub-questions >= {when.min_sub_questions}")
    if when.needs_clarification is not None:
        if when.needs_clarification != bool(intent.clarifications):
            return None
        reasons.append(f"ambiguity {intent.ambiguity}: {'needs' if intent.clarifications else 'no'} clarification")
    if when.question_matches is not None:
        try:
            matched = regex.search(when.question_matches, intent.question, timeout=REGEX_TIMEOUT_S)
        except TimeoutError:
            return None  # a pathological pattern is a non-match, never a stalled query
        if not matched:
            return None
        reasons.append(f"question matches /{when.question_matches}/")
    return reasons or ["unconditional"]


def _resolve(spec: RouteSpec, fallback: RouteSpec, intent: Intent) -> ResolvedRoute:
    return ResolvedRoute(
        action=spec.action,
        strategies=list(spec.strategies or fallback.strategies or DEFAULT_STRATEGIES),
        top_k=spec.top_k or fallback.top_k or 6,
        rerank=spec.rerank if spec.rerank is not None else fallback.rerank,
        adaptive=spec.adaptive if spec.adaptive is not None else fallback.adaptive,
        tier=spec.tier or fallback.tier or intent.complexity,
        use_time_filter=spec.use_time_filter,
        split_parts=spec.split_parts,
    )


def route(intent: Intent, guidelines: GuidelineSet, version: int | None = None) -> RouteDecision:
    """The first guideline (by priority, then name) whose condition holds; else the fallback."""
    for guideline in sorted(guidelines.guidelines, key=lambda g: (g.priority, g.name)):
        reasons = _reasons(guideline.when, intent)
        if reasons is not None:
            return RouteDecision(guideline=guideline.name, reasons=reasons, confidence=round(intent.confidence, 3),
                                 route=_resolve(guideline.route, guidelines.fallback, intent),
                                 guidelines_version=version)
    return RouteDecision(guideline=None, reasons=["no guideline matched; fallback route"],
                         confidence=round(intent.confidence * 0.5, 3),
                         route=_resolve(guidelines.fallback, guidelines.fallback, intent), guidelines_version=version)
