"""The local scorers on crafted cases with a known verdict, and the properties every score keeps."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from rag_service.domain import METRICS, Evaluation, EvidenceContext, MetricScore
from rag_service.review.gate import GatePolicy, gate
from rag_service.scoring import consistency, correctness, coverage, faithfulness, freshness, relevance, traceability
from rag_service.scoring.evidence import ScoringInput
from rag_service.scoring.local import DEFAULT_WEIGHTS, evaluate, score_metrics
from rag_service.text.facts import compare, facts

NOW = datetime(2026, 11, 23, tzinfo=UTC)
POLICY = ("The refund window is 30 days from delivery. Refunds are paid to the original card within 5 business "
          "days. Customers in Norway are not eligible for cash refunds.")
QUESTION = "How long is the refund window?"


def inp(answer: str, contexts: list[str] | None = None, question: str = QUESTION, **kw: object) -> ScoringInput:
    return ScoringInput(question=question, answer=answer,
                        contexts=[EvidenceContext(text=c) for c in ([POLICY] if contexts is None else contexts)],
                        now=NOW, **kw)


def value(metric, answer: str, **kw: object) -> float | None:  # noqa: ANN001
    return metric.score(inp(answer, **kw)).value


def test_facts_are_normalised() -> None:
    found = facts("Three people met Ada Lovelace on 5 March 1843 and did not leave.")
    assert {"3", "5", "1843"} <= found.numbers and "mar" in found.dates
    assert {"ada", "lovelac"} <= found.names and found.negated
    assert facts("1,000 people").numbers == {"1000"}


def test_a_fact_is_checked_where_it_stands() -> None:
    evidence = "They gave up 308 points and made 24 interceptions."
    assert compare("They gave up 308 points.", evidence).contradicted == ()
    assert compare("They gave up 24 points.", evidence).contradicted == ("24",)
    assert compare("They gave up 99 points.", evidence).contradicted == ("99",)


def test_a_faithful_answer_scores_above_an_unfaithful_one() -> None:
    good = value(faithfulness, "The refund window is 30 days from delivery [1].")
    paraphrase = value(faithfulness, "Refunds can be asked for within 30 days of delivery [1].")
    invented = value(faithfulness, "The refund window is 90 days and refunds arrive in cash [1].")
    unrelated = value(faithfulness, "The Eiffel Tower was finished in 1889 [1].")
    assert good == 1.0
    assert good > paraphrase > invented > unrelated
    assert value(faithfulness, "The refund window is 30 days.", contexts=[]) is None


def test_a_changed_number_or_negated_claim_lowers_correctness() -> None:
    right = value(correctness, "The refund window is 30 days from delivery [1].")
    changed = value(correctness, "The refund window is 45 days from delivery [1].")
    negated = value(correctness, "Customers in Norway are eligible for cash refunds [1].")
    assert right == 1.0 and changed < 0.6 and negated < 0.6
    reason = correctness.score(inp("The refund window is 45 days from delivery [1].")).reason
    assert "45" in reason


def test_correctness_against_a_reference_answer() -> None:
    assert value(correctness, "It is 30 days [1].", reference="30 days") == 1.0
    assert value(correctness, "It is 14 days [1].", reference="30 days") < 0.5


def test_relevance_prefers_an_answer_to_the_question() -> None:
    on_topic = value(relevance, "The refund window is 30 days from delivery [1].")
    off_topic = value(relevance, "Refunds are paid to the original card [1].")
    assert on_topic > off_topic


def test_coverage_counts_the_parts_answered() -> None:
    parts = ["How long is the refund window?", "Where are refunds paid?"]
    both = value(coverage, "The refund window is 30 days [1]. Refunds are paid to the original card [1].",
                 parts=parts)
    one = value(coverage, "The refund window is 30 days [1].", parts=parts)
    assert one < both and one <= 0.75


def test_conflicting_sources_lower_consistency() -> None:
    a = "The product launch is scheduled for March 3, 2025 in Berlin."
    b = "The product launch is scheduled for April 9, 2025 in Berlin."
    answer = "The product launch is scheduled for March 3, 2025 in Berlin [1][2]."
    agreeing = value(consistency, answer, contexts=[a, a.replace("Berlin", "Berlin, Germany")])
    conflicting = consistency.score(inp(answer, contexts=[a, b], question="When is the launch?"))
    assert agreeing == 1.0 and conflicting.value is not None and conflicting.value < 1.0
    assert "disagree" in conflicting.reason
    contradicting_itself = value(consistency, "The launch is on March 3 in Berlin. The launch is on April 9 in Berlin.",
                                 contexts=[a])
    assert contradicting_itself < 1.0


def test_a_stale_source_lowers_freshness() -> None:
    def dated(days: int) -> ScoringInput:
        return ScoringInput(question=QUESTION, answer="The window is 30 days [1].", now=NOW,
                            contexts=[EvidenceContext(text=POLICY, effective_date=NOW - timedelta(days=days))])

    assert freshness.score(dated(0)).value == 1.0
    assert abs(freshness.score(dated(365), half_life_days=365).value - 0.5) < 1e-3
    assert freshness.score(dated(30)).value > freshness.score(dated(900)).value
    assert value(freshness, "The window is 30 days [1].") is None  # no dates: cannot judge


def test_an_uncited_sentence_lowers_traceability() -> None:
    cited = value(traceability, "The refund window is 30 days from delivery [1]. Refunds are paid to the original "
                                "card [1].")
    half = value(traceability, "The refund window is 30 days from delivery [1]. Refunds are paid to the original "
                               "card.")
    assert cited == 1.0 and half == 0.5


def test_every_metric_has_a_reason_and_the_local_scorer() -> None:
    scores = score_metrics(inp("The refund window is 30 days from delivery [1]."))
    assert [s.metric for s in scores] == list(METRICS)
    assert all(s.scorer == "local-v1" and s.reason.endswith(".") for s in scores)


TEXT = st.text(st.sampled_from(list("abc xyz 0123 ABC. ,[1]not")), min_size=0, max_size=80)


@settings(max_examples=150, deadline=None)
@given(answer=TEXT.filter(lambda t: t.strip()), contexts=st.lists(TEXT, max_size=3), question=TEXT)
def test_scores_are_in_range_or_none_and_overall_between_min_and_max(answer: str, contexts: list[str],
                                                                     question: str) -> None:
    evaluation = evaluate(inp(answer, contexts=contexts, question=question or "?"))
    values = [s.value for s in evaluation.scores if s.value is not None]
    assert all(0 <= v <= 1 for v in values)
    if evaluation.overall is not None:
        assert min(values) - 1e-9 <= evaluation.overall <= max(values) + 1e-9


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.none(), st.floats(0, 1)), min_size=7, max_size=7))
def test_a_low_overall_always_asks_for_review(values: list[float | None]) -> None:
    scores = [MetricScore(metric=m, value=v, reason="r", scorer="t") for m, v in zip(METRICS, values, strict=True)]
    evaluation = Evaluation.from_scores(scores, DEFAULT_WEIGHTS)
    verdict = gate(evaluation, GatePolicy(metric_thresholds={"faithfulness": 0.8, "correctness": 0.8,
                                                             "relevance": 0.6}))
    critical = verdict.flagged and set(verdict.flagged) & {"faithfulness", "correctness"}
    if evaluation.overall is None or evaluation.overall < 0.8:
        assert verdict.needs_review and verdict.tier in {"high", "normal"}
        assert verdict.reasons[0].startswith("overall")
        assert (verdict.tier == "high") == (evaluation.overall is None or evaluation.overall < 0.6)
    elif critical:
        assert verdict.needs_review and verdict.tier == "normal" and verdict.reasons
    else:
        assert not verdict.needs_review and verdict.tier is None and verdict.reasons == ()


def test_review_findings_stay_fixed() -> None:
    # a prefix of a number is not a quote
    assert value(faithfulness, "The refund window is 3 [1].") < 0.8
    # a "not" in the neighbouring sentence does not count against a claim
    assert value(faithfulness, "Refunds are paid to the original card within 5 business days [1].") == 1.0
    paraphrase = "Refunds go back to the original card within 5 business days [1]."
    assert value(correctness, paraphrase) == 1.0
    # names are not numeric conflicts; nothing comparable is not "consistent"
    assert value(consistency, "Bob met Ann in Rome. Bob met Eve in Rome.", contexts=["Bob met Ann in Rome."]) == 1.0
    assert value(consistency, "The refund window is 30 days [1].", contexts=[]) is None
    # a question with no content words cannot be judged for relevance
    assert value(relevance, "Because the card was refunded [1].", question="Why?") is None
    assert facts("1,000.50 or 1.000,50").numbers == {"1000.50"}


def test_a_flagged_faithfulness_is_reviewed_even_with_a_high_overall() -> None:
    scores = [MetricScore(metric=m, value=0.3 if m == "faithfulness" else 1.0, reason="r", scorer="t")
              for m in METRICS]
    verdict = gate(Evaluation.from_scores(scores, DEFAULT_WEIGHTS), GatePolicy(metric_thresholds={"faithfulness": 0.8}))
    assert verdict.needs_review and verdict.tier == "normal" and verdict.reasons == ("faithfulness: 0.30 < 0.80",)
