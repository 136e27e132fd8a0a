"""The pieces that need no database: the answer's correctness against its references, a run's summary
of metrics no item could grade, and the collection a dataset's corpus goes to."""

from __future__ import annotations

import json
from pathlib import Path

from evaluation.datasets import load_beir
from evaluation.items import EvalItem, full_item, reference_correctness
from evaluation.preparation import default_collection
from evaluation.summary import summarise
from rag_service.domain import EvalItemResult, QueryRequest


def test_reference_correctness_takes_the_best_reference_and_scores_no_answer_as_wrong() -> None:
    references = ["Denver Broncos", "the Broncos"]
    right, scorer = reference_correctness("The Denver Broncos won Super Bowl 50 [1].", references)
    wrong, _ = reference_correctness("The Carolina Panthers lost the game [1].", references)
    assert right == 1.0 and scorer == "local-v1"
    assert wrong < 0.5
    assert reference_correctness(None, references) == (0.0, "local-v1")
    assert reference_correctness("", references)[0] == 0.0
    assert reference_correctness("It is.", ["the", "a"])[0] is None  # nothing in the references to compare


def test_a_metric_no_item_could_grade_is_in_the_summary_with_n_zero() -> None:
    results = [EvalItemResult(item_id=f"q{i}", repetition=0, question="q",
                              metrics={"faithfulness": 0.5 + i / 10, "consistency": None}) for i in range(3)]
    metrics = summarise(results)["metrics"]
    assert metrics["faithfulness"] == {"mean": 0.6, "n": 3}
    assert metrics["consistency"] == {"mean": None, "n": 0}


def _beir(root: Path, corpus: dict[str, str], qrels: str) -> Path:
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps({"_id": d, "title": "", "text": t}) + "\n"
                                               for d, t in corpus.items()))
    (root / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "which one?"}) + "\n")
    (root / "qrels" / "test.tsv").write_text(f"query-id\tcorpus-id\tscore\n{qrels}\n")
    return root


def test_the_default_collection_follows_the_corpus_not_the_qrels(tmp_path: Path) -> None:
    corpus = {"d1": "Tides follow the moon.", "d2": "Bees dance."}
    base = load_beir(_beir(tmp_path / "a" / "set", corpus, "q1\td1\t1"), "test")
    other_qrels = load_beir(_beir(tmp_path / "b" / "set", corpus, "q1\td2\t1"), "test")
    edited = load_beir(_beir(tmp_path / "c" / "set", {**corpus, "d2": "Bees waggle."}, "q1\td1\t1"), "test")
    assert base.version != other_qrels.version  # different datasets...
    assert default_collection(base) == default_collection(other_qrels)  # ...on the same documents
    assert default_collection(edited) != default_collection(base)


async def test_an_eval_item_is_asked_in_the_runs_tenants_collection() -> None:
    """Full-mode eval runs ask through the pipeline with the stored key (acme/kb), which the API's
    name pattern would refuse: the request is built from the name and then pointed at the key."""
    class Recorder:
        request: QueryRequest | None = None

        async def run(self, request: QueryRequest, emit: object = None) -> None:
            self.request = request
            raise RuntimeError("recorded")

    pipeline = Recorder()
    result = await full_item(pipeline, EvalItem(id="1", question="Which code?"), "acme/kb", 0,  # type: ignore[arg-type]
                             answer_metrics=None, context_texts=None, prices=None,  # type: ignore[arg-type]
                             late_grades={}, wait_for_grades=False)
    assert pipeline.request is not None and pipeline.request.collection == "acme/kb"
    assert result.error is not None and "recorded" in result.error
