"""The question-to-passage token alignment (alignment.py) with the real local encoder."""

from __future__ import annotations

import numpy as np

from rag_service.pipeline.generation.alignment import alignment, passage, words_of
from rag_service.providers.embeddings import TokenVectors

CHUNK = ("The Normans were the people who gave their name to Normandy. Their identity emerged in the first half of "
         "the 10th century. They adopted the Catholic faith.")


def test_the_passage_is_the_sentence_and_the_next() -> None:
    assert passage(CHUNK, "The Normans were the people who gave their name to Normandy.") == (
        "The Normans were the people who gave their name to Normandy. Their identity emerged in the first half of "
        "the 10th century.")
    assert passage(CHUNK, "They adopted the Catholic faith.") == "They adopted the Catholic faith."  # the last
    assert passage(CHUNK, "A sentence from elsewhere.") == "A sentence from elsewhere."


def test_a_paraphrase_aligns_better_than_a_passage_on_the_same_topic(local_embedder) -> None:
    question = "In what century did the Norman identity first emerge?"
    answers = "Their identity emerged in the first half of the 10th century."
    paraphrase = "Normans first formed a distinct identity during the 900s."
    sibling = "The Normans adopted the Catholic faith and the language of the Franks."
    asked, *found = local_embedder.encode_tokens([question, answers, paraphrase, sibling])
    idf = {"centuri": 1.0, "norman": 0.2, "ident": 1.5, "first": 1.0, "emerg": 2.0}
    scores = [alignment(question, asked, f, idf) for f in found]
    assert scores[0][0] > scores[2][0] and scores[1][0] > scores[2][0]  # mean: both beat the sibling
    assert scores[2][1] > scores[0][1]  # the sibling's worst miss is worse


def test_alignment_is_bounded_and_handles_nothing_to_match(local_embedder) -> None:
    question = "What is it?"  # no content words: every token counts
    asked, found = local_embedder.encode_tokens([question, "It is a rock."])
    mean, worst = alignment(question, asked, found, {})
    assert -1.0 <= mean <= 1.0 and 0.0 <= worst <= 2.0
    empty = TokenVectors(np.zeros((0, 384), dtype=np.float32), [])
    assert alignment(question, asked, empty, {}) == (0.0, 1.0)


def test_each_token_maps_to_its_whole_word_and_punctuation_to_nothing() -> None:
    text = "Where's Harvard-Allston's stadium?"
    spans = [(0, 5), (5, 6), (6, 7), (8, 15), (15, 16), (16, 19), (19, 23), (23, 24), (24, 25), (26, 33), (33, 34)]
    assert words_of(text, spans) == ["Where", "", "s", "Harvard", "", "Allston", "Allston", "", "s", "stadium", ""]
