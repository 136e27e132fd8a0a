"""The judge and ragas together, and how their scores combine with the local ones."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rag_service.domain import METRICS, MetricScore
from rag_service.scoring.combine import JUDGE_WEIGHT, RAGAS_WEIGHT, combine
from rag_service.scoring.evidence import LOCAL_SCORER
from rag_service.scoring.judge import JUDGED_METRICS
from rag_service.scoring.llm_grading import llm_grade
from rag_service.scoring.local import score_metrics
from tests.fake_openai import FakeOpenAI, Reply
from tests.scoring.llm_fakes import (
    JUDGE_PROMPT,
    config_for,
    embed,
    judge_messages,
    judge_reply,
    llm_for,
    queue_ragas,
    scoring_input,
)

# --- the two together -------------------------------------------------------------------------------------

async def test_llm_grade_runs_judge_and_ragas_and_combines_them_with_the_local_scores(server: FakeOpenAI) -> None:
    inp = scoring_input()
    server.on(JUDGE_PROMPT, judge_reply())
    queue_ragas(server, verdicts=(1, 0))
    llm = llm_for(server.url)
    grades = await llm_grade(inp, model=llm, messages=judge_messages(inp), ragas_config=config_for(server.url),
                             embed=embed, budget_s=10)
    assert grades.notes == [] and grades.judge_note is None
    assert len(grades.judge) == 5 and len(grades.ragas) == 2 and len(grades.scores) == 7
    local = score_metrics(inp)
    combined = {s.metric: s for s in grades.combined(local)}
    assert list(combined) == list(METRICS)
    faithfulness = combined["faithfulness"]
    assert faithfulness.value == pytest.approx(0.6 * 0.9 + 0.4 * 0.5)
    assert faithfulness.scorer == "llm-judge:judge-model+ragas:Faithfulness"
    assert "judge (0.90: The one claim is stated in passage 1)" in faithfulness.reason
    assert "ragas (0.50: 50% of the answer's statements" in faithfulness.reason
    assert combined["relevance"].scorer == "llm-judge:judge-model+ragas:ResponseRelevancy"
    assert combined["coverage"].value == 0.7 and combined["coverage"].scorer == "llm-judge:judge-model"
    local_by_metric = {s.metric: s for s in local}
    assert combined["freshness"] == local_by_metric["freshness"]
    assert combined["traceability"] == local_by_metric["traceability"]


async def test_llm_grade_with_a_failing_judge_keeps_local_scores_and_ragas(server: FakeOpenAI) -> None:
    inp = scoring_input()
    server.on(JUDGE_PROMPT, Reply(status=500))
    queue_ragas(server, verdicts=(1, 1))
    grades = await llm_grade(inp, model=llm_for(server.url), messages=judge_messages(inp),
                             ragas_config=config_for(server.url), embed=embed, budget_s=10)
    assert grades.judge == [] and grades.judge_note is not None
    assert grades.notes == [grades.judge_note] and grades.judge_note.startswith("llm judge call failed")
    combined = {s.metric: s for s in grades.combined(score_metrics(inp))}
    assert combined["faithfulness"].value == 1 and combined["faithfulness"].scorer == "ragas:Faithfulness"
    assert combined["coverage"].scorer == LOCAL_SCORER
    assert "local score kept: llm judge call failed" in combined["coverage"].reason
    assert "local score kept" not in combined["freshness"].reason


async def test_llm_grade_with_nothing_configured_scores_nothing() -> None:
    grades = await llm_grade(scoring_input(), model=None, messages=None, ragas_config=None, embed=None, budget_s=1)
    assert grades.scores == [] and grades.notes == []
    local = score_metrics(scoring_input())
    assert grades.combined(local) == local
    with pytest.raises(ValueError, match="rendered messages"):
        await llm_grade(scoring_input(), model=object(), messages=None, ragas_config=None,  # type: ignore[arg-type]
                        embed=None, budget_s=1)


# --- combine (pure) ---------------------------------------------------------------------------------------

values = st.one_of(st.none(), st.floats(min_value=0, max_value=1, allow_nan=False))


def score(metric: str, value: float | None, scorer: str) -> MetricScore:
    return MetricScore(metric=metric, value=value, reason=f"{scorer} says so.", scorer=scorer)  # type: ignore[arg-type]


@st.composite
def graded(draw: st.DrawFn) -> tuple[list[MetricScore], list[MetricScore], list[MetricScore]]:
    local = [score(m, draw(values), LOCAL_SCORER) for m in METRICS]
    judge = [score(m, draw(values), "llm-judge:m") for m in draw(st.sets(st.sampled_from(JUDGED_METRICS)))]
    ragas = [score(m, draw(values), f"ragas:{m}") for m in draw(st.sets(st.sampled_from(METRICS)))]
    return local, draw(st.permutations(judge)), ragas


@given(graded(), st.lists(st.text(min_size=1, max_size=20), max_size=2))
def test_combine_properties(scores: tuple[list[MetricScore], ...], notes: list[str]) -> None:
    local, judge, ragas = scores
    combined = combine(local, judge, ragas, notes)
    assert [s.metric for s in combined] == list(METRICS)  # every metric once, in order
    by = {name: {s.metric: s for s in group} for name, group in (("local", local), ("judge", judge),
                                                                   ("ragas", ragas))}
    for s in combined:
        assert s.value is None or 0 <= s.value <= 1
        j, r = by["judge"].get(s.metric), by["ragas"].get(s.metric)
        j_value = j.value if j else None
        r_value = r.value if r else None
        if j_value is not None and r_value is not None:
            assert min(j_value, r_value) <= s.value <= max(j_value, r_value)
            assert s.value == pytest.approx(JUDGE_WEIGHT * j_value + RAGAS_WEIGHT * r_value)
            assert s.scorer == f"{j.scorer}+{r.scorer}"
        elif j_value is not None:
            assert s == j
        elif r_value is not None:
            assert s == r
        else:
            assert s.value == by["local"][s.metric].value and s.scorer == LOCAL_SCORER


def test_combine_refuses_incomplete_or_repeated_scores() -> None:
    local = [score(m, 0.5, LOCAL_SCORER) for m in METRICS]
    with pytest.raises(ValueError, match="lack"):
        combine(local[:-1], [], [])
    with pytest.raises(ValueError, match="twice"):
        combine(local, [score("coverage", 1, "j"), score("coverage", 0, "j")], [])
