"""The rule-based Router: guidelines are data (condition -> route, priority), the decision is a
pure function of the intent and the guideline set, and "no guideline matched" is a decision too."""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources

import regex
import yaml

from rag_service.domain import Condition, GuidelineSet, Intent, ResolvedRoute, RouteDecision, RouteSpec
from rag_service.domain.routing import REGEX_TIMEOUT_S
from rag_service.domain.strategies import strategy_names
from rag_service.pipeline.intent import RULES_UNSURE_BELOW


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


def _resolve(spec: RouteSpec, fallback: RouteSpec, intent: Intent, strategies: Sequence[str]) -> ResolvedRoute:
    return ResolvedRoute(
        action=spec.action,
        strategies=list(spec.strategies or fallback.strategies or strategies),
        top_k=spec.top_k or fallback.top_k or 6,
        rerank=spec.rerank if spec.rerank is not None else fallback.rerank,
        adaptive=spec.adaptive if spec.adaptive is not None else fallback.adaptive,
        tier=spec.tier or fallback.tier or intent.complexity,
        use_time_filter=spec.use_time_filter,
        split_parts=spec.split_parts,
    )


def route(intent: Intent, guidelines: GuidelineSet, version: int | None = None, *,
          strategies: Sequence[str] | None = None) -> RouteDecision:
    """The first guideline (by priority, then name) whose condition holds; else the fallback.
    ``strategies`` are for routes that name none: the service's configured ones (default: every
    registered strategy)."""
    strategies = strategies or strategy_names()
    # The design: when the rules are unsure what the question asks, no guideline acts on a guessed
    # query type; only those that ask back may apply, else the fallback route.
    unsure = intent.confidence < RULES_UNSURE_BELOW
    for guideline in sorted(guidelines.guidelines, key=lambda g: (g.priority, g.name)):
        if unsure and guideline.route.action != "clarify":
            continue
        reasons = _reasons(guideline.when, intent)
        if reasons is not None:
            return RouteDecision(guideline=guideline.name, reasons=reasons, confidence=round(intent.confidence, 3),
                                 route=_resolve(guideline.route, guidelines.fallback, intent, strategies),
                                 guidelines_version=version)
    why = (f"intent unsure (confidence {intent.confidence:.2f} < {RULES_UNSURE_BELOW}); fallback route" if unsure
           else "no guideline matched; fallback route")
    return RouteDecision(guideline=None, reasons=[why],
                         confidence=round(intent.confidence * 0.5, 3),
                         route=_resolve(guidelines.fallback, guidelines.fallback, intent, strategies),
                         guidelines_version=version)
