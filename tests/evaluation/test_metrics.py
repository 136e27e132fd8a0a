"""Per-item metrics: ranx IR figures against hand-computed ones, SQuAD v1.1, and ragas' metrics on real
strings (offline, with the real local embedder, and LLM-judged against the fake OpenAI server)."""

from __future__ import annotations

import json
import math
import random
import sys
from collections.abc import Sequence

import numpy as np
import pytest

from evaluation import metrics as metrics_module
from evaluation.metrics import (
    EVAL_EXTRA,
    NO_RESULT,
    RAGAS_LLM_METRICS,
    AnswerMetrics,
    best_match,
    ir_metrics,
    normalize,
    ranking,
    relevant_rank,
    squad_scores,
    token_f1,
)
from rag_service.domain.eval_runs import IR_METRICS, RAGAS_OFFLINE_METRICS
from rag_service.scoring.ragas_scores import RagasConfig
from tests.fake_openai import FakeOpenAI, Reply

PARIS = "Paris is the capital and largest city of France, with an estimated population of two million."
BANANAS = "Bananas are grown in tropical regions and are harvested while still green for export."
SACKS = "Pro Bowl defensive tackle Kawann Short led the team in sacks with 11."
BRONCOS = "The Broncos won Super Bowl 50 on February 7, 2016, beating the Panthers 24-10."

# --- retrieval --------------------------------------------------------------------------------------


def test_ir_metrics_match_hand_computed_figures() -> None:
    qrels = {"q1": {"d1": 1, "d3": 2, "d9": 0}, "q2": {"x": 1, "y": 1}, "q3": {"z": 1}}
    rankings = {"q1": ["d2", "d1", "d1", "d3"],  # the duplicate d1 collapses: d2, d1, d3
                "q2": ["x"],
                "q3": [f"n{i}" for i in range(11)] + ["z"]}  # z at rank 12
    scores = ir_metrics(qrels, rankings)
    assert set(scores) == {"q1", "q2", "q3"} and all(set(s) == set(IR_METRICS) for s in scores.values())
    # Linear gains (ranx's ndcg, as trec_eval): DCG = 1/log2(3) + 2/log2(4), ideal = 2/log2(2) + 1/log2(3).
    dcg, ideal = 1 / math.log2(3) + 2 / math.log2(4), 2 + 1 / math.log2(3)
    assert scores["q1"] == pytest.approx({"ndcg@10": dcg / ideal, "recall@10": 1.0, "recall@100": 1.0,
                                          "mrr@10": 0.5})
    # One of two relevant documents, at rank 1: nDCG = 1 / (1 + 1/log2(3)).
    assert scores["q2"] == pytest.approx({"ndcg@10": 1 / (1 + 1 / math.log2(3)), "recall@10": 0.5,
                                          "recall@100": 0.5, "mrr@10": 1.0})
    assert scores["q3"] == pytest.approx({"ndcg@10": 0.0, "recall@10": 0.0, "recall@100": 1.0, "mrr@10": 0.0})


def test_empty_rankings_score_zero_and_unjudged_items_are_skipped() -> None:
    qrels = {"empty": {"a": 1}, "negative": {"a": 0, "b": -1}, "judged": {"a": 2}}
    scores = ir_metrics(qrels, {"empty": [], "negative": ["a"], "unknown": ["a"], "judged": ["a"]})
    assert scores["empty"] == dict.fromkeys(IR_METRICS, 0.0)
    assert scores["judged"] == dict.fromkeys(IR_METRICS, 1.0)
    assert set(scores) == {"empty", "judged"}  # nothing relevant, or no qrels: no metrics, no crash
    assert ir_metrics(qrels, {}) == {} and ir_metrics({}, {"x": ["a"]}) == {}


def test_a_batch_scores_each_item_as_it_would_alone() -> None:
    # ranx returns the batch as arrays; this checks each row lands on its own item.
    rng = random.Random(7)
    docs = [f"d{i}" for i in range(40)]
    qrels = {f"q{i}": {d: rng.randint(1, 2) for d in rng.sample(docs, 3)} for i in range(25)}
    rankings = {q: rng.sample(docs, rng.randint(0, 30)) for q in reversed(list(qrels))}
    batch = ir_metrics(qrels, rankings)
    assert len({round(s["ndcg@10"], 6) for s in batch.values()}) > 5  # the items really differ
    for item, ranked in rankings.items():
        assert batch[item] == pytest.approx(ir_metrics(qrels, {item: ranked})[item])


def test_rankings_beyond_the_deepest_cutoff_do_not_change_the_metrics() -> None:
    deep = [f"n{i}" for i in range(150)] + ["hit"]
    assert ir_metrics({"q": {"hit": 1}}, {"q": deep})["q"] == dict.fromkeys(IR_METRICS, 0.0)


def test_ranking_collapses_duplicates_and_marks_an_empty_run() -> None:
    assert ranking(["b", "a", "b", "c"]) == {"b": 3.0, "a": 2.0, "c": 1.0}
    assert ranking([]) == {NO_RESULT: 0.0}


def test_without_ranx_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ranx", None)
    with pytest.raises(ImportError, match=EVAL_EXTRA.replace("[", r"\[").replace("]", r"\]")):
        ir_metrics({"q": {"a": 1}}, {"q": ["a"]})


def test_relevant_rank() -> None:
    relevant = {"a": 0, "b": 1, "c": 2}
    assert relevant_rank(relevant, ["x", "a", "a", "c", "b"]) == 3  # a is judged irrelevant; a's repeat collapses
    assert relevant_rank(relevant, ["b"]) == 1
    assert relevant_rank(relevant, ["x", "a"]) is None
    assert relevant_rank(relevant, []) is None


# --- SQuAD v1.1 -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("The Denver Broncos!", "denver broncos"),
    ("an apple, a pear and THE plum.", "apple pear and plum"),
    ("theatre  anthem", "theatre anthem"),  # articles only as whole words
    ("  A  ", ""),
    ("Super Bowl-50", "super bowl50"),  # punctuation is removed, not replaced by a space
])
def test_squad_normalisation(text: str, expected: str) -> None:
    assert normalize(text) == expected


def test_token_f1_and_the_best_reference() -> None:
    assert token_f1("Denver Broncos won", "the Denver Broncos") == pytest.approx(2 * 2 / 5)
    assert token_f1("the", "a") == 1.0  # both normalise to nothing: they agree, as in SQuAD's script
    assert token_f1("Panthers", "Broncos") == 0.0
    assert best_match("the Broncos", ["Carolina Panthers", "Denver Broncos", "Broncos"]) == (1.0, 1.0, "Broncos")
    with pytest.raises(ValueError):
        best_match("x", [])


def test_squad_scores() -> None:
    assert squad_scores("Denver Broncos.", ["Broncos", "The Denver Broncos"]) == {
        "squad_exact_match": 1.0, "squad_f1": 1.0}
    assert squad_scores("Broncos", ["Denver Broncos"]) == pytest.approx({"squad_exact_match": 0.0,
                                                                         "squad_f1": 2 / 3})
    assert squad_scores(None, ["Broncos"]) == {"squad_exact_match": 0.0, "squad_f1": 0.0}
    assert squad_scores("Broncos", []) == {"squad_exact_match": None, "squad_f1": None}


# --- ragas, offline ---------------------------------------------------------------------------------


async def offline(answer: str | None, references: list[str], retrieved: list[str] | None = None,
                  expected: list[str] | None = None) -> tuple[dict[str, float | None], dict[str, str]]:
    return await AnswerMetrics().score(answer=answer, references=references, retrieved_contexts=retrieved or [],
                                       reference_contexts=expected or [])


async def test_exact_match_is_ragas_strict_string_equality_best_over_references() -> None:
    values, scorers = await offline("Paris", ["Berlin", "Paris"])
    assert values["ragas_exact_match"] == 1.0 and scorers["ragas_exact_match"] == "ragas:ExactMatch"
    values, _ = await offline("paris.", ["Paris"])
    assert values["ragas_exact_match"] == 0.0  # unlike SQuAD's, which normalises first
    assert squad_scores("paris.", ["Paris"])["squad_exact_match"] == 1.0


async def test_rouge_and_bleu_rank_answers_by_overlap() -> None:
    reference = ["The capital of France is Paris."]
    same, _ = await offline("The capital of France is Paris.", reference)
    paraphrase, scorers = await offline("Paris is the capital of France.", reference)
    unrelated, _ = await offline("Bananas grow in warm climates.", reference)
    # ROUGE-L: the longest common subsequence "the capital of france" is 4 of 6 tokens each way.
    assert paraphrase["ragas_rouge_l"] == pytest.approx(4 / 6)
    for metric in ("ragas_rouge_l", "ragas_bleu"):
        assert same[metric] == pytest.approx(1.0)
        assert 1.0 > paraphrase[metric] > unrelated[metric]
    assert unrelated["ragas_rouge_l"] == 0.0 and unrelated["ragas_bleu"] < 0.1  # BLEU's smoothing credits "."
    assert scorers["ragas_rouge_l"] == "ragas:RougeScore(rougeL)" and scorers["ragas_bleu"] == "ragas:BleuScore"


async def test_context_precision_and_recall_by_string_similarity() -> None:
    near_copy = PARIS.replace("two million", "2.1 million")  # a chunk need not equal its reference exactly
    values, scorers = await offline(None, [], [near_copy, BANANAS], [PARIS])
    assert values["ragas_context_precision"] == pytest.approx(1.0)
    assert values["ragas_context_recall"] == 1.0
    assert scorers["ragas_context_precision"] == "ragas:NonLLMContextPrecisionWithReference"
    assert scorers["ragas_context_recall"] == "ragas:NonLLMContextRecall"
    values, _ = await offline(None, [], [BANANAS, PARIS], [PARIS])
    assert values["ragas_context_precision"] == pytest.approx(0.5)  # the relevant context only at rank 2
    values, _ = await offline(None, [], [PARIS], [PARIS, SACKS])
    assert values["ragas_context_recall"] == 0.5
    values, _ = await offline(None, [], [BANANAS], [PARIS])
    assert values["ragas_context_precision"] == 0.0 and values["ragas_context_recall"] == 0.0
    values, scorers = await offline(None, [], [], [PARIS])
    assert values["ragas_context_precision"] == 0.0 and values["ragas_context_recall"] == 0.0
    assert scorers["ragas_context_recall"] == "ragas:NonLLMContextRecall"


async def test_what_cannot_be_computed_is_none_with_the_reason() -> None:
    values, scorers = await offline("  ", ["Paris"], [PARIS], [])
    assert set(values) == set(RAGAS_OFFLINE_METRICS) and all(v is None for v in values.values())
    assert scorers["ragas_bleu"] == "ragas:BleuScore (not scored: no answer)"
    assert scorers["ragas_context_recall"] == "ragas:NonLLMContextRecall (not scored: no reference contexts)"
    values, scorers = await offline("Paris", ["", " "])
    assert values["ragas_rouge_l"] is None and scorers["ragas_rouge_l"].endswith("(not scored: no reference answer)")
    assert scorers["ragas_semantic_similarity"].endswith("(not scored: no reference answer)")
    values, scorers = await offline("Paris", ["Paris"])
    assert values["ragas_semantic_similarity"] is None
    assert scorers["ragas_semantic_similarity"].endswith("(not scored: no embedder was given)")


async def test_semantic_similarity_is_the_cosine_of_our_embedder(local_embedder) -> None:  # noqa: ANN001
    metric = AnswerMetrics(embed=local_embedder.embed)
    reference = "Paris is the capital of France."
    scored = {}
    for answer in ("Paris is the capital of France.", "The French capital is Paris.", "Bananas grow on trees."):
        values, scorers = await metric.score(answer=answer, references=[reference], retrieved_contexts=[],
                                             reference_contexts=[])
        scored[answer] = values["ragas_semantic_similarity"]
        vectors = local_embedder.encode([answer, reference])
        assert scored[answer] == pytest.approx(float(np.clip(vectors[0] @ vectors[1], 0, 1)), abs=1e-5)
    assert scorers["ragas_semantic_similarity"] == "ragas:SemanticSimilarity"
    identical, paraphrase, unrelated = scored.values()
    assert identical == pytest.approx(1.0, abs=1e-5)
    assert 1.0 > paraphrase > 0.7 > unrelated >= 0.0


async def test_the_same_item_scores_identically_twice(local_embedder) -> None:  # noqa: ANN001
    metric = AnswerMetrics(embed=local_embedder.embed)
    item = {"answer": "Kawann Short led the team with 11 sacks.", "references": ["Kawann Short", SACKS],
            "retrieved_contexts": [BRONCOS, SACKS], "reference_contexts": [SACKS]}
    first, second = await metric.score(**item), await metric.score(**item)
    assert first == second
    assert all(isinstance(v, float) for v in first[0].values())


@pytest.mark.parametrize(("module", "metrics"), [("sacrebleu", {"ragas_bleu"}), ("rouge_score", {"ragas_rouge_l"}),
                                                 ("rapidfuzz", {"ragas_context_precision", "ragas_context_recall"})])
async def test_a_missing_scorer_dependency_leaves_only_its_metrics_out(monkeypatch: pytest.MonkeyPatch, module: str,
                                                                       metrics: set[str]) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # importing it now raises ImportError
    values, scorers = await offline("The capital is Paris.", ["Paris is the capital."], [PARIS], [PARIS])
    assert {m for m, v in values.items() if v is None} == metrics | {"ragas_semantic_similarity"}
    for metric in metrics:
        assert module in scorers[metric] and EVAL_EXTRA in scorers[metric]


async def test_without_ragas_every_metric_is_none_and_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    async def missing() -> str:
        return "ragas is not installed"

    monkeypatch.setattr(metrics_module, "load_ragas", missing)
    values, scorers = await AnswerMetrics(llm=RagasConfig(base_url="http://127.0.0.1:1", model="m")).score(
        answer="Paris", references=["Paris"], retrieved_contexts=[PARIS], reference_contexts=[PARIS], question="Q?")
    assert set(values) == set(RAGAS_OFFLINE_METRICS) | set(RAGAS_LLM_METRICS)
    assert all(v is None for v in values.values())
    assert scorers["ragas_exact_match"] == f"ragas:ExactMatch (not scored: ragas is not installed; {EVAL_EXTRA})"


# --- ragas, LLM-judged --------------------------------------------------------------------------------

RECALL_PROMPT = "classify if the statement can be attributed to the given context"
STATEMENTS_PROMPT = "Break down each sentence into one or more fully understandable statements"
CLASSIFIER_PROMPT = "Given a ground truth and an answer statements"




def queue_judgements(server: FakeOpenAI) -> None:
    server.on(RECALL_PROMPT, json.dumps({"classifications": [
        {"statement": "Kawann Short led the team in sacks.", "reason": "stated", "attributed": 1},
        {"statement": "Kawann Short had 12 sacks.", "reason": "the context says 11", "attributed": 0}]}))
    server.on(STATEMENTS_PROMPT, json.dumps({"statements": ["Kawann Short led the team in sacks."]}))
    server.on(CLASSIFIER_PROMPT, json.dumps({"TP": [{"statement": "Kawann Short led", "reason": "matches"}],
                                             "FP": [{"statement": "12 sacks", "reason": "not in the reference"}],
                                             "FN": []}))
    # Context precision asks once per retrieved context; the context's text tells the prompts apart.
    server.on("Super Bowl 50", json.dumps({"reason": "not about sacks", "verdict": 0}))
    server.on("Pro Bowl defensive tackle", json.dumps({"reason": "names the sack leader", "verdict": 1}))


async def judged(server: FakeOpenAI, **changes: object) -> tuple[dict[str, float | None], dict[str, str]]:
    metric = AnswerMetrics(llm=RagasConfig(base_url=server.url, model="ragas-model", api_key="sk-test"),
                           llm_timeout_s=10)
    item: dict = {"question": "Who led the Panthers in sacks?", "answer": "Kawann Short, with 12 sacks.",
                  "references": ["Kawann Short led the team with 11 sacks."],
                  "retrieved_contexts": [BRONCOS, SACKS], "reference_contexts": [SACKS]}
    return await metric.score(**{**item, **changes})


async def test_llm_metrics_against_the_endpoint(server: FakeOpenAI) -> None:
    queue_judgements(server)
    values, scorers = await judged(server)
    assert values["ragas_llm_context_recall"] == 0.5  # one of two reference statements is in the contexts
    assert values["ragas_llm_context_precision"] == pytest.approx(0.5)  # the useful context at rank 2
    assert values["ragas_llm_answer_correctness"] == pytest.approx(2 / 3)  # F1 of 1 TP, 1 FP (no embedder)
    assert [scorers[m] for m in RAGAS_LLM_METRICS] == ["ragas:ContextRecall", "ragas:ContextPrecisionWithReference",
                                                       "ragas:AnswerCorrectness"]
    assert values["ragas_context_recall"] == 1.0  # the offline ones are still there
    requests = [r["body"] for r in server.requests]
    # 1 recall + 2 precision (one per context) + 2 statement lists + 1 classification, JSON mode.
    assert len(requests) == 6
    assert {r["model"] for r in requests} == {"ragas-model"}
    assert all(r["response_format"] == {"type": "json_object"} for r in requests)


async def test_answer_correctness_blends_in_our_embedder_cosine(server: FakeOpenAI) -> None:
    vectors = {"Kawann Short, with 12 sacks.": [0.6, 0.8], "Kawann Short led the team with 11 sacks.": [1.0, 0.0]}

    async def embed(texts: Sequence[str]) -> np.ndarray:
        return np.array([vectors.get(t, [0.0, 1.0]) for t in texts])

    queue_judgements(server)
    metric = AnswerMetrics(embed=embed, llm=RagasConfig(base_url=server.url, model="ragas-model"))
    values, _ = await metric.score(question="Who led the Panthers in sacks?", answer="Kawann Short, with 12 sacks.",
                                   references=["Kawann Short led the team with 11 sacks."],
                                   retrieved_contexts=[SACKS], reference_contexts=[])
    # ragas' weights: 0.75 x factuality F1 (2/3) + 0.25 x cosine (0.6).
    assert values["ragas_llm_answer_correctness"] == pytest.approx(0.75 * 2 / 3 + 0.25 * 0.6)
    assert values["ragas_semantic_similarity"] == pytest.approx(0.6)


async def test_a_failing_llm_metric_is_none_and_the_others_still_score(server: FakeOpenAI) -> None:
    server.on(RECALL_PROMPT, Reply("I cannot do that."))
    queue_judgements(server)
    values, scorers = await judged(server)
    assert values["ragas_llm_context_recall"] is None
    assert scorers["ragas_llm_context_recall"].startswith("ragas:ContextRecall (not scored: failed: ")
    assert values["ragas_llm_context_precision"] == pytest.approx(0.5)
    assert values["ragas_llm_answer_correctness"] == pytest.approx(2 / 3)


async def test_llm_metrics_skip_what_they_cannot_judge(server: FakeOpenAI) -> None:
    queue_judgements(server)
    values, scorers = await judged(server, question=" ")
    assert all(values[m] is None for m in RAGAS_LLM_METRICS)
    assert scorers["ragas_llm_context_recall"] == "ragas:ContextRecall (not scored: no question)"
    values, scorers = await judged(server, answer=None, retrieved_contexts=[])
    assert values["ragas_llm_context_recall"] == values["ragas_llm_context_precision"] == 0.0
    assert scorers["ragas_llm_answer_correctness"] == "ragas:AnswerCorrectness (not scored: no answer)"
    assert server.requests == []


def test_a_failing_ranx_warm_up_is_logged_and_does_not_fail_the_run(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    calls: list[object] = []

    def broken(*args: object) -> dict[str, dict[str, float]]:
        calls.append(args)
        raise RuntimeError("numba cache unreadable")

    monkeypatch.setattr(metrics_module, "ir_metrics", broken)
    metrics_module.warm_up_ir_metrics()
    assert calls and "ranx did not warm up" in caplog.text and "numba cache unreadable" in caplog.text
