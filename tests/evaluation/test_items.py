"""The per-item pieces that need no database: the answer's correctness against its references, and a
run's summary of metrics no item could grade."""

from __future__ import annotations

from evaluation.items import reference_correctness
from evaluation.summary import summarise
from rag_service.domain import EvalItemResult


def test_reference_correctness_takes_the_best_reference_and_scores_no_answer_as_wrong() -> None:
    references = ["Denver Broncos", "the Broncos"]
    right, scorer = reference_correctness("The Denver Broncos won Super Bowl 50 [1].", references)
    wrong, _ = reference_correctness("The Carolina Panthers lost the game [1].", references)
    assert right == 1.0 and scorer == "local-v1"
    assert wrong < 0.5
    assert reference_correctness(None, references) == (0.0, "local-v1")
    assert reference_correctness("", references)[0] == 0.0


def test_a_metric_no_item_could_grade_is_in_the_summary_with_n_zero() -> None:
    results = [EvalItemResult(item_id=f"q{i}", repetition=0, question="q",
                              metrics={"faithfulness": 0.5 + i / 10, "consistency": None}) for i in range(3)]
    metrics = summarise(results)["metrics"]
    assert metrics["faithfulness"] == {"mean": 0.6, "n": 3}
    assert metrics["consistency"] == {"mean": None, "n": 0}
