"""Abstention, confidence and short answers of the extractive generator (issue 16), with the
shipped models: question kinds and focus, short-answer candidates, the answerability features,
and the generator's decisions."""

from __future__ import annotations

import math
import re
import uuid

import numpy as np
import pytest

from rag_service.config import Settings
from rag_service.domain import Candidate, SearchHit
from rag_service.errors import ProviderError
from rag_service.pipeline.generation.answerability import (
    ALIGNED_FEATURES,
    FEATURES,
    Evidence,
    assess,
    confidence_model,
    default_model,
    undecided,
)
from rag_service.pipeline.generation.extractive import ABSTAIN_BELOW, ExtractiveGenerator
from rag_service.pipeline.generation.spans import (
    ENTITIES_MODEL_FEATURES,
    PARSED_FEATURES,
    ShortAnswerModel,
    candidates,
    scored_candidates,
    short_answer,
)
from rag_service.pipeline.generation.spans import FEATURES as SPAN_FEATURES
from rag_service.text.questions import expected_kind, focus

PANTHERS = ("The Panthers defense gave up just 308 points, ranking sixth in the league. Pro Bowl defensive tackle "
            "Kawann Short led the team in sacks with 11. The team played its home games in Charlotte.")
BRONCOS = "The Broncos won Super Bowl 50 on February 7, 2016, beating the Panthers 24-10."


def candidate(text: str, uri: str, cosine: float | None) -> Candidate:
    hit = SearchHit(chunk_id=uuid.uuid4(), document_id=uuid.uuid4(), parent_id=None, ordinal=0, source_uri=uri,
                    title=uri, text=text, start_char=0, end_char=len(text), score=1.0)
    return Candidate(hit=hit, fused_score=1.0, scores={} if cosine is None else {"semantic": cosine})


@pytest.mark.parametrize("question, kind", [
    ("How many points did the defense give up?", "number"),
    ("What percentage of voters turned out?", "number"),
    ("When did the war end?", "date"),
    ("In what year was it founded?", "date"),
    ("Who led the team in sacks?", "person"),
    ("Where is the stadium?", "place"),
    ("Which team won the game?", "name"),
    ("Why is the sky blue?", None),
    ("What is photosynthesis?", None),
])
def test_question_kinds(question: str, kind: str | None) -> None:
    assert expected_kind(question) == kind


def test_focus_keeps_names_and_numbers_but_not_the_first_word() -> None:
    asked = focus("Who won the 2022 FIFA World Cup?")
    assert {"2022", "fifa", "world", "cup"} <= asked.entities and "who" not in asked.entities
    assert ("world", "cup") in asked.pairs and "won" in asked.terms


def test_candidates_are_numbers_dates_and_names_never_pronouns_or_question_words() -> None:
    sentence = "He said they won 24 games in 2015 under Ron Rivera at Bank of America Stadium."
    found = {(c.text, c.kind) for c in candidates(sentence, "How many games did the Panthers win in 2015?")}
    assert ("24", "number") in found  # the unit the question names is dropped
    assert ("Ron Rivera", "name") in found and ("Bank of America Stadium", "name") in found
    assert not any(text in {"He", "they", "2015"} for text, _ in found)  # 2015 is in the question


def test_short_answer_is_a_span_of_the_sentence_of_the_asked_kind() -> None:
    sentence = "Pro Bowl defensive tackle Kawann Short led the team in sacks with 11."
    scored = scored_candidates("Who led the Panthers in sacks?", sentence)
    assert scored[0][0].text == "Kawann Short" and scored[0][0].text in sentence
    assert all(0 <= p <= 1 for _, p in scored)
    assert short_answer("Who led the Panthers in sacks?", sentence) == "Kawann Short"
    # Precision first: with no evidence that the passage answers, no short answer.
    assert short_answer("Who led the Panthers in sacks?", sentence, answerable=0.0) is None
    assert short_answer("Why is the sky blue?", "The sky is blue because of Rayleigh scattering.") is None


def test_shipped_models_are_trained_and_match_the_code() -> None:
    for model in (default_model(), confidence_model()):
        assert model.features == FEATURES and "XQuAD" in model.trained_on
        assert np.any(model.weights != 0)
    for model in (default_model(aligned=True), confidence_model(aligned=True)):
        assert model.features == ALIGNED_FEATURES and "XQuAD" in model.trained_on
        assert model.weights[ALIGNED_FEATURES.index("align_mean")] > 0  # a closer match, more likely answered
    for depth, names in ((None, SPAN_FEATURES), ("entities", ENTITIES_MODEL_FEATURES), ("full", PARSED_FEATURES)):
        spans = ShortAnswerModel.default(depth)
        assert spans.weights.features == names and 0 < spans.threshold < 1 and "XQuAD" in spans.weights.trained_on


def test_the_default_abstention_threshold_is_the_operating_point_the_training_chose() -> None:
    # Retraining moves the operating point with the model (train_answerability.py writes it there).
    assert default_model().threshold == ABSTAIN_BELOW == Settings.model_fields["answer_abstain_below"].default
    off_topic = re.search(r"(\d+) without their article", default_model().trained_on)
    assert off_topic and int(off_topic.group(1)) > 0  # trained on the off-topic examples too


def _evidence(question: str, sentence: str, cosines: list[float]) -> Evidence:
    return Evidence(question=question, best_sentence=sentence, best_chunk=sentence, best_coverage=0.5,
                    other_coverage=0.1, context=[sentence], idf={}, cosines=cosines)


def test_evidence_holding_the_question_scores_higher_than_evidence_that_does_not() -> None:
    question = "How many points did the Panthers defense give up?"
    holds = assess(_evidence(question, "The Panthers defense gave up just 308 points.", [0.7, 0.3]))
    lacks = assess(_evidence(question, "The Broncos played their home games in Denver.", [0.7, 0.3]))
    assert holds.probability > lacks.probability and holds.confidence > lacks.confidence


def test_unknown_cosines_are_no_evidence_either_way() -> None:
    """Without a semantic search the cosine features are unknown: they are left out of the
    features shown and read as the training mean, not as a zero similarity."""
    question = "How many points did the Panthers defense give up?"
    sentence = "The Panthers defense gave up just 308 points."
    unknown = assess(_evidence(question, sentence, []))
    assert "cosine_top" not in unknown.features and 0 < unknown.probability < 1
    mean = default_model().mean[FEATURES.index("cosine_top")]
    gap = default_model().mean[FEATURES.index("cosine_gap")]
    at_mean = assess(_evidence(question, sentence, [mean, mean - gap]))
    assert math.isclose(unknown.probability, at_mean.probability, rel_tol=0.05)


async def test_the_generator_answers_what_the_passages_hold_and_abstains_otherwise(local_embedder) -> None:
    """With the real local encoder, as the service runs it."""
    context = [candidate(PANTHERS, "panthers", 0.62), candidate(BRONCOS, "broncos", 0.35)]
    generator = ExtractiveGenerator(token_encoder=local_embedder)
    answered = await generator.generate("How many points did the Panthers defense give up?", [], context)
    assert answered.answered and answered.citations[0].source_uri == "panthers"
    assert answered.answerability is not None and answered.confidence > 0.5

    unrelated = [candidate(PANTHERS, "panthers", 0.12), candidate(BRONCOS, "broncos", 0.1)]
    declined = await generator.generate("What is the boiling point of mercury on Mars in 1850?", [], unrelated)
    assert not declined.answered and declined.citations == [] and declined.claims == []
    assert declined.short_answer is None  # precision first: nothing to copy a span from
    assert "do not appear to answer" in declined.answer and declined.confidence < generator.abstain_below
    assert [s.source_uri for s in declined.closest_sources] == ["panthers", "broncos"]
    assert all(not s.verified and s.quote for s in declined.closest_sources)

    # Abstention off: the same evidence gets the stitched answer (with its low confidence).
    forced = await ExtractiveGenerator(abstain_below=0.0, token_encoder=local_embedder).generate(
        "What is the boiling point of mercury on Mars in 1850?", [], unrelated)
    assert forced.answered and forced.citations and forced.confidence < 0.5


async def test_the_token_alignment_separates_a_matching_passage_and_is_asked_only_near_the_threshold(
        local_embedder) -> None:
    context = [candidate(PANTHERS, "panthers", 0.62), candidate(BRONCOS, "broncos", 0.35)]
    generator = ExtractiveGenerator(token_encoder=local_embedder)
    holds = generator.select("How many points did the Panthers defense give up?", [], context).evidence
    lacks = generator.select("What is the boiling point of mercury on Mars in 1850?", [], context).evidence
    holds, lacks = await generator.aligned(holds), await generator.aligned(lacks)
    assert holds.alignment[0] > 0.8 and lacks.alignment[0] < holds.alignment[0] - 0.2  # weighted mean
    assert lacks.alignment[1] > holds.alignment[1]  # the worst miss
    assert assess(holds).probability > assess(lacks).probability

    question = "How many points did the Panthers defense give up?"
    clear = await generator.generate(question, [], context)
    assert not undecided(clear.answerability["probability"], generator.abstain_below)
    assert "align_mean" not in clear.answerability  # far from the threshold: no encoder call
    near = await ExtractiveGenerator(abstain_below=clear.answerability["probability"], token_encoder=local_embedder
                                     ).generate(question, [], context)
    assert "align_mean" in near.answerability  # at the threshold: the aligned models decide


def test_without_an_encoder_the_alignment_is_unknown() -> None:
    """The synchronous path (and a service whose embedder is remote) has no token vectors: the
    alignment features are left out of those shown and read as the training mean."""
    context = [candidate(PANTHERS, "panthers", 0.62), candidate(BRONCOS, "broncos", 0.35)]
    answer = ExtractiveGenerator().extract("How many points did the Panthers defense give up?", [], context)
    assert answer.answered and "align_mean" not in answer.answerability
    assert "cosine_top" in answer.answerability


def test_a_question_without_content_words_is_not_taken_as_answered() -> None:
    """Nothing to match is no evidence: "What is it?" must not look fully covered."""
    sentence = "The team played its home games in Charlotte."
    vague = assess(_evidence("What is it?", sentence, [0.3, 0.2]))
    specific = assess(_evidence("Where did the team play its home games?", sentence, [0.3, 0.2]))
    assert vague.features["best_share"] == 0.0 and vague.probability < specific.probability
    assert specific.confidence <= 0.99  # never certain


def test_a_bare_year_can_be_a_count() -> None:
    found = {(c.text, c.kind) for c in candidates("About 1500 soldiers crossed the river in 1066.",
                                                 "How many soldiers crossed the river?")}
    assert ("1500", "number") in found and ("1066", "date") in found
    assert candidates("It lasted 45 percent of the time.", "What percentage of the time did it last?")[0].text \
        == "45 percent"  # "percent" is not a word of the question ("percentage" is)


def test_undecided_is_a_band_in_log_odds_around_the_threshold_wider_below_it() -> None:
    assert undecided(0.1, 0.1) and undecided(0.05, 0.1) and undecided(0.01, 0.1)
    assert undecided(0.12, 0.1) and not undecided(0.13, 0.1)  # 0.21 and 0.30 log-odds over (the band: 0.25)
    assert undecided(0.006, 0.1) and not undecided(0.005, 0.1)  # 2.92 and 3.10 log-odds under (the band: 3)
    assert not undecided(0.1, 0.0) and not undecided(0.9, 1.0)  # those thresholds decide without a model
    assert undecided(0.5, 0.1, below=1.0, above=10.0) and not undecided(0.05, 0.1, below=0.5, above=10.0)


async def test_a_failing_token_encoder_leaves_the_default_models_deciding() -> None:
    """An encoder that fails (a full disk while quantising, a runtime error) costs no answer: the
    default models decide, and the broken encoder is not asked again."""

    class Broken:
        calls = 0

        async def token_vectors(self, texts):  # noqa: ANN001, ANN202
            Broken.calls += 1
            raise ProviderError("could not encode token vectors (onnx): OSError: disk full", stage="embedder")

    context = [candidate(PANTHERS, "panthers", 0.62), candidate(BRONCOS, "broncos", 0.35)]
    question = "How many points did the Panthers defense give up?"
    probability = ExtractiveGenerator().extract(question, [], context).answerability["probability"]
    generator = ExtractiveGenerator(abstain_below=probability, token_encoder=Broken())  # at the threshold
    first = await generator.generate(question, [], context)
    again = await generator.generate(question, [], context)
    assert Broken.calls == 1 and "align_mean" not in first.answerability
    assert first.answerability == again.answerability == ExtractiveGenerator(abstain_below=probability).extract(
        question, [], context).answerability
