"""The SQuAD reader experiment's pure parts: the passages it trains on and the figures it reports."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.reader_cv import abstention, short_answers
from benchmarks.squad_reader import chosen_threshold, training_items

ARTICLE = {"title": "Rivers", "paragraphs": [
    {"context": "The Rhine rises in the Alps. It flows north to the sea. Its length is 1,230 km.",
     "qas": [{"id": "q1", "question": "How long is the Rhine?",
              "answers": [{"text": "1,230 km", "answer_start": 70}]}]},
    {"context": "The Danube is long too. Many cities lie on the Rhine and its length is debated.",
     "qas": []},
    {"context": "Some say 1,230 km is too long for the Rhine. Others measure it shorter.", "qas": []},
]}
MIDDLE = {"title": "Rivers", "paragraphs": [
    {"context": "The Rhine rises in the Alps. It was named Rhenus by the Romans. Its length is 1,230 km.",
     "qas": [{"id": "q2", "question": "What did the Romans call the Rhine?",
              "answers": [{"text": "Rhenus", "answer_start": 42}]}]},
]}


def test_training_items_holds_the_answer_and_the_two_kinds_of_negative() -> None:
    items = training_items([ARTICLE], questions=1, same_paragraph=1.0, sibling=1.0, rng=np.random.default_rng(0))
    positive, same, sibling = items
    question, passage, at, answer, _ = positive
    assert question == "How long is the Rhine?"
    # The answer's sentence first (the one the service reads its span from), then the next: the last
    # sentence has none.
    assert passage == "Its length is 1,230 km." and passage[at:at + len(answer)] == "1,230 km"
    assert same[1] in ARTICLE["paragraphs"][0]["context"] and "1,230" not in same[1] and same[2] is None
    # The sibling paragraphs' sentence pair sharing most of the question's content words, among those
    # without the answer's text: the first pair of the second paragraph ("long", "Rhine"), not the
    # third paragraph's first sentence ("long", "Rhine" too, but it holds "1,230 km").
    assert sibling[1] == ARTICLE["paragraphs"][1]["context"] and sibling[2] is None


def test_training_items_start_at_the_answers_sentence() -> None:
    (question, passage, at, answer, _), = training_items(
        [MIDDLE], questions=1, same_paragraph=0.0, sibling=0.0, rng=np.random.default_rng(0))
    assert passage == "It was named Rhenus by the Romans. Its length is 1,230 km."
    assert passage[at:at + len(answer)] == "Rhenus"


def test_training_items_without_negatives() -> None:
    items = training_items([ARTICLE], questions=1, same_paragraph=0.0, sibling=0.0, rng=np.random.default_rng(0))
    assert len(items) == 1 and items[0][2] is not None


def test_short_answers_are_ranked_surest_first() -> None:
    examples = [{"answers": ["Paris"]}, {"answers": ["1990"]}, {"answers": ["blue"]}, {"answers": ["x"]}]
    readings = {0: {"text": "Paris", "probability": 0.9}, 1: {"text": "1991", "probability": 0.8},
                2: {"text": "Blue.", "probability": 0.7}, 3: {"text": "", "probability": 0.9}}
    setting = np.array(["full", "full", "full", "removed"])
    out = short_answers(examples, readings, setting, "probability")
    # Surest first: right, wrong, right.
    assert out["exact_match_by_coverage"]["1.0"] == round(2 / 3, 4)
    assert out["exact_match_by_coverage"]["0.16"] == 1.0  # fewer questions than one in six: the surest one
    assert out["largest_coverage_at_em_0.60"] == 1.0
    readings[2]["text"] = "green"
    assert short_answers(examples, readings, setting, "probability")["largest_coverage_at_em_0.60"] == round(1 / 3, 4)


def test_abstention_reads_its_threshold_from_the_full_collection() -> None:
    setting = np.array(["full"] * 100 + ["removed"] * 4 + ["article"])
    scores = np.concatenate([np.linspace(1, 100, 100), [0.5, 3.0, 4.0, 50.0], [0.0]])
    out = abstention(scores, setting)
    # Answering 96% of the full collection puts the threshold near 5: three of four removed fall below.
    assert out["0.96"] == 0.75


def test_the_threshold_is_the_lowest_probability_whose_answers_reach_the_target() -> None:
    # (probability, passes as a short answer, exactly right), surest first: 1.0 right, 0.9 right,
    # 0.8 wrong, 0.7 right, 0.6 wrong; 0.95 never passes, so it is never given.
    readings = [(0.6, True, False), (1.0, True, True), (0.8, True, False), (0.95, False, True), (0.7, True, True),
                (0.9, True, True)]
    assert chosen_threshold(readings, target=0.75) == {"probability": 0.7, "coverage": round(4 / 6, 4),
                                                       "exact_match": 0.75}
    assert chosen_threshold(readings, target=1.0)["probability"] == 0.9


def test_single_sentence_passages_hold_the_answers_sentence_alone() -> None:
    items = training_items([ARTICLE], questions=1, same_paragraph=1.0, sibling=0.0, rng=np.random.default_rng(0),
                           sentences_per_passage=1)
    (_, passage, at, answer, _), (_, negative, none, _, _) = items
    assert passage == "Its length is 1,230 km." and passage[at:at + len(answer)] == "1,230 km"
    assert none is None and negative in ("The Rhine rises in the Alps.", "It flows north to the sea.")


def test_training_on_after_leaves_out_the_questions_an_earlier_run_sampled() -> None:
    many = {"title": "Numbers", "paragraphs": [
        {"context": f"Item {i} is numbered {i}.",
         "qas": [{"id": f"q{i}", "question": f"What is item {i} numbered?",
                  "answers": [{"text": str(i), "answer_start": len(f"Item {i} is numbered ")}]}]}
        for i in range(40)]}

    def asked(questions: int, after: int = 0) -> set[str]:
        return {item[0] for item in training_items([many], questions=questions, same_paragraph=0.0, sibling=0.0,
                                                   rng=np.random.default_rng(0), after=after)}

    earlier, later = asked(15), asked(15, after=15)
    assert len(earlier) == len(later) == 15 and not earlier & later
    assert asked(25, after=15) == asked(40) - earlier  # all the rest, when there are no more


def test_the_shipped_graph_gives_every_parameter_of_the_reader() -> None:
    import onnx
    from transformers import BertConfig, BertForQuestionAnswering

    from benchmarks.reader_checkpoint import state_dict
    from benchmarks.squad_reader import SHIPPED
    from rag_service.providers.local_onnx import _model_dir

    config = BertConfig.from_pretrained(str(_model_dir()), local_files_only=True)
    config.num_labels = 2
    wanted = {name: tuple(p.shape) for name, p in BertForQuestionAnswering(config).state_dict().items()
              if not name.endswith("position_ids")}
    found = state_dict(onnx.load(str(SHIPPED)))
    assert {name: value.shape for name, value in found.items()} == wanted
    # The int8 matrices come back as floats on their scale's grid (at most 127 steps from zero).
    query = found["bert.encoder.layer.0.attention.self.query.weight"]
    steps = np.abs(query).max() / 127
    assert query.dtype == np.float32 and np.allclose(query / steps, np.round(query / steps), atol=1e-3)


def test_a_distilled_reader_keeps_evenly_spaced_layers_the_first_and_the_last_among_them() -> None:
    from benchmarks.reader_distill import kept_layers

    assert kept_layers(6, 4) == [0, 2, 3, 5]
    assert kept_layers(6, 3) == [0, 2, 5] and kept_layers(6, 6) == list(range(6)) and kept_layers(6, 1) == [0]
    with pytest.raises(ValueError):
        kept_layers(6, 7)


def test_the_distillation_loss_is_zero_for_the_teachers_own_logits_and_ignores_padding() -> None:
    import torch

    from benchmarks.reader_distill import distillation_loss

    teacher = torch.tensor([[2.0, 0.5, -1.0, 0.0], [0.0, 3.0, 1.0, 9.0]])
    mask = torch.tensor([[True, True, True, True], [True, True, True, False]])  # the second row's last is padding
    assert distillation_loss(teacher, teacher, mask, 2.0).item() == pytest.approx(0.0, abs=1e-6)
    padded = teacher.clone()
    padded[1, 3] = -50.0  # what the student says at padding does not count
    assert distillation_loss(padded, teacher, mask, 2.0).item() == pytest.approx(0.0, abs=1e-6)
    assert distillation_loss(teacher.flip(-1), teacher, mask, 2.0).item() > 0.1
    assert torch.isfinite(distillation_loss(teacher.flip(-1), teacher, mask, 0.5))  # a temperature below 1 too
