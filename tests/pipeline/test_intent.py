"""IntentParser and time expressions as table tests; the router on the shipped guidelines."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rag_service.domain import Guideline, GuidelineSet, RouteSpec, Turn
from rag_service.pipeline.intent import IntentParser, dangling_references, extract_entities, resolve_references
from rag_service.pipeline.router import default_guidelines, route
from rag_service.pipeline.timeexpr import extract_time_ranges

NOW = datetime(2026, 11, 22, 15, 30, tzinfo=UTC)
parser = IntentParser()


def day(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text).replace(tzinfo=UTC) if text else None


@pytest.mark.parametrize("text, start, end", [
    ("what changed last week", "2026-11-09", "2026-11-16"),
    ("sales this week", "2026-11-16", "2026-11-23"),
    ("revenue in Q2 2025", "2025-04-01", "2025-07-01"),
    ("2025 Q4 numbers", "2025-10-01", "2026-01-01"),
    ("errors since March", "2026-03-01", None),
    ("errors since December", "2025-12-01", None),
    ("since March 2024", "2024-03-01", None),
    ("posts in 2024", "2024-01-01", "2025-01-01"),
    ("in May 2025", "2025-05-01", "2025-06-01"),
    ("before 2023", None, "2023-01-01"),
    ("after 2023", "2024-01-01", None),
    ("between 2024 and 2021", "2021-01-01", "2025-01-01"),
    ("yesterday's outage", "2026-11-21", "2026-11-22"),
    ("this quarter", "2026-10-01", "2027-01-01"),
    ("last month", "2026-10-01", "2026-11-01"),
    ("last year", "2025-01-01", "2026-01-01"),
    ("since 2024-03-05", "2024-03-05", None),
])
def test_time_expressions(text: str, start: str | None, end: str | None) -> None:
    [found] = extract_time_ranges(text, NOW)
    assert (found.start, found.end) == (day(start), day(end))


def test_relative_spans_end_now() -> None:
    [found] = extract_time_ranges("incidents in the last 30 days", NOW)
    assert found.start == day("2026-10-23") and found.end == NOW
    assert extract_time_ranges("may I ask what this is", NOW) == []


@pytest.mark.parametrize("question, query_type, complexity", [
    ("What is HNSW?", "factual", "simple"),
    ("error E-4012", "exact_lookup", "simple"),
    ('find "connection pool exhausted"', "exact_lookup", "simple"),
    ("Compare HNSW and IVFFlat for recall", "comparison", "moderate"),
    ("HNSW vs IVFFlat vs brute force: which is fastest?", "comparison", "complex"),
    ("Summarize the incident reports", "summary", "moderate"),
    ("What changed in Q2 2025?", "temporal", "moderate"),
    ("When was the index rebuilt?", "temporal", "moderate"),
    ("What is BM25? How does RRF fuse rankings?", "multi_step", "complex"),
    ("hello!", "out_of_scope", "simple"),
    ("thanks", "out_of_scope", "simple"),
])
def test_query_types(question: str, query_type: str, complexity: str) -> None:
    intent = parser.parse(question, NOW)
    assert (intent.query_type, intent.complexity) == (query_type, complexity)


@pytest.mark.parametrize("question, asks", [
    ("compare it", "compared with"),
    ("What about that document?", "Which document"),
    ("HNSW", "What would you like to know about HNSW"),
    ("tell me about stuff", "specific subject"),
    ("When was he elected by Nixon?", "Which document"),
    ("How do I fix it?", "Which document"),
    ("Who are their competitors?", "Which document"),
])
def test_ambiguous_questions_get_clarifications(question: str, asks: str) -> None:
    intent = parser.parse(question, NOW)
    assert intent.ambiguity >= parser.ambiguity_threshold
    assert any(asks in q for q in intent.clarifications), intent.clarifications
    assert intent.missing


@pytest.mark.parametrize("question, dangling", [
    ("How does it work?", ["it"]), ("Who wrote that?", ["that"]), ("Is that true?", ["that"]),
    ("When was he elected by Nixon?", ["he"]), ("Who is the translator of this hymn?", ["this"]),
    ("Who wrote that hymn?", ["that"]), ("What are its limits?", ["its"]),
    # An antecedent in the question: a name before the pronoun, or the asked-for subject.
    ("When did Victoria enact its constitution?", []), ("Which company changed its name?", []),
    ("Who may not require that its teachers be certified?", []),
    # "that" as a conjunction or a relative pronoun.
    ("Evidence indicates that Cydippids are not what?", []), ("What was the fort that was being built?", []),
    # "I" is no antecedent, nor a capital that starts a sentence or fills a question in capitals.
    ("How do I fix it?", ["it"]), ("Can I delete it?", ["it"]), ("HOW DOES IT WORK?", ["IT"]),
    ("It failed. Why did it stop?", ["It", "it"]), ("Why it's slow?", ["it"]),
    # The asked-for subject is no antecedent where "who"/"which" is followed by "be".
    ("Who are their competitors?", ["their"]), ("Who is her manager?", ["her"]),
    # Not references: a time, a clause, a placeholder subject.
    ("What changed this week?", []), ("Is it possible to resize HNSW?", []), ("What is that?", ["that"]),
])
def test_references_that_point_outside_the_question(question: str, dangling: list[str]) -> None:
    assert dangling_references(question) == dangling


@pytest.mark.parametrize("question", ["What is HNSW?", "How does PostgreSQL replicate data to standbys?",
                                      "error E-4012", "Compare HNSW and IVFFlat",
                                      "When did Victoria enact its constitution?",
                                      "Evidence indicates that Cydippids are not what?"])
def test_clear_questions_need_no_clarification(question: str) -> None:
    intent = parser.parse(question, NOW)
    assert intent.clarifications == [] and intent.ambiguity < parser.ambiguity_threshold


def test_entities() -> None:
    entities = extract_entities('Did Project Falcon fix E-4012 in "pool sizing" for 3 teams? Ask NASA')
    assert entities.identifiers == ["E-4012"]
    assert entities.quoted == ["pool sizing"]
    assert "Project Falcon" in entities.names and "NASA" in entities.names
    assert entities.numbers == ["3"]


def test_follow_ups_resolve_references_from_the_last_turn() -> None:
    history = [Turn(question="What is HNSW?", subject="HNSW")]
    intent = parser.parse("How does it scale and what are its limits?", NOW, history)
    assert intent.question == "How does HNSW scale and what are HNSW's limits?"
    assert intent.resolved_references == {"it": "HNSW", "its": "HNSW's"}
    assert intent.clarifications == []
    text, _ = resolve_references("Summarize that document", [Turn(question="x", subject="the Q3 report")])
    assert text == "Summarize the Q3 report"
    unchanged, resolved = resolve_references("Is this year better?", [Turn(question="x", subject="HNSW")])
    assert unchanged == "Is this year better?" and resolved == {}


def test_router_first_match_by_priority_and_fallback() -> None:
    guidelines = default_guidelines()
    lookup = route(parser.parse("error E-4012", NOW), guidelines, version=3)
    assert lookup.guideline == "exact-lookup" and lookup.route.strategies[0] == "pattern"
    assert lookup.guidelines_version == 3 and lookup.reasons == ["query type is exact_lookup"]
    assert route(parser.parse("compare it", NOW), guidelines).route.action == "clarify"
    assert route(parser.parse("hi there", NOW), guidelines).route.action == "decline"
    timed = route(parser.parse("What failed since March?", NOW), guidelines)
    assert timed.guideline == "time-scoped" and timed.route.use_time_filter
    plain = route(parser.parse("How does PostgreSQL replicate data?", NOW), guidelines)
    assert plain.guideline is None and "fallback" in plain.reasons[0]
    assert plain.route.action == "answer" and plain.route.tier == "simple"


def test_priority_ties_break_by_name_deterministically() -> None:
    both = GuidelineSet(guidelines=[
        Guideline(name="zeta", priority=1, route=RouteSpec(top_k=3)),
        Guideline(name="alpha", priority=1, route=RouteSpec(top_k=4)),
    ])
    assert route(parser.parse("anything at all", NOW), both).guideline == "alpha"


def test_guideline_sets_are_validated() -> None:
    with pytest.raises(ValueError, match="unique"):
        GuidelineSet(guidelines=[Guideline(name="a", priority=1, route=RouteSpec()),
                                 Guideline(name="a", priority=2, route=RouteSpec())])
    with pytest.raises(ValueError, match="regex"):
        GuidelineSet.model_validate({"guidelines": [{"name": "r", "priority": 1, "when": {"question_matches": "("},
                                                     "route": {}}]})
    with pytest.raises(ValueError, match="fallback"):
        GuidelineSet(guidelines=[], fallback=RouteSpec(action="clarify"))


@given(st.text(max_size=300))
def test_any_text_yields_an_intent_and_a_route(text: str) -> None:
    intent = parser.parse(text, NOW)
    decision = route(intent, default_guidelines())
    assert decision.route.action in ("answer", "clarify", "decline")
    assert 0 <= intent.ambiguity <= 1
    if decision.route.action == "clarify":
        assert intent.clarifications


def test_type_confidence_comes_from_the_cues() -> None:
    assert parser.parse("Compare HNSW and IVFFlat", NOW).confidence == 1.0  # one cue
    conflicted = parser.parse("Summarize and compare the changes since March", NOW)
    assert conflicted.query_type == "comparison" and conflicted.confidence == round(1 / 3, 3)
    assert parser.parse("How does PostgreSQL replicate data?", NOW).confidence == 1.0  # factual, clear
    assert parser.parse("it?", NOW).confidence == 0.0
