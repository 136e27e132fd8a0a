"""The span reader (issue 16): its decoding, the shipped graph read for real, its short answers'
checks, and the extractive generator reading with it (and without it, once it fails)."""

from __future__ import annotations

import json
import uuid
from importlib.resources import files

import numpy as np
import pytest

from rag_service.domain import Candidate, SearchHit, SpanReading
from rag_service.errors import ProviderError
from rag_service.pipeline.generation.answerability import (
    ALIGNED_FEATURES,
    FEATURES,
    READER_GAP_LIMIT,
    Evidence,
    assess,
    default_model,
    features,
    undecided,
)
from rag_service.pipeline.generation.extractive import ExtractiveGenerator
from rag_service.pipeline.generation.read_answers import (
    THRESHOLD_FILE,
    is_answer_span,
    reader_short_answer,
    shipped_threshold,
)
from rag_service.pipeline.generation.selection import SECOND_LOOK_SENTENCES, reader_input
from rag_service.providers.reader import (
    GRAPH_FILE,
    MAX_ANSWER_TOKENS,
    NOTHING_READ,
    READ_TOKENS,
    OnnxSpanReader,
    ReaderUnavailableError,
    best_span,
    default_reader,
    question_term_chars,
    read_tokens,
    reading_window,
)
from rag_service.text.terms import term_spans, terms

PANTHERS = ("The Panthers defense gave up just 308 points, ranking sixth in the league. Pro Bowl defensive tackle "
            "Kawann Short led the team in sacks with 11. The team played its home games in Charlotte.")
BRONCOS = "The Broncos won Super Bowl 50 on February 7, 2016, beating the Panthers 24-10."
TREATY = ("The committee met in Geneva to discuss the treaty on the river's water rights. "
          "The agreement was finally signed in 1921 by both governments.")


def candidate(text: str, uri: str) -> Candidate:
    hit = SearchHit(chunk_id=uuid.uuid4(), document_id=uuid.uuid4(), parent_id=None, ordinal=0, source_uri=uri,
                    title=uri, text=text, start_char=0, end_char=len(text), score=1.0)
    return Candidate(hit=hit, fused_score=1.0, scores={"semantic": 0.6})


def test_best_span_takes_the_highest_start_plus_end_within_the_length_limit() -> None:
    start = np.array([5.0, 0.0, 4.0, 1.0, 0.0])
    end = np.array([5.0, 0.0, 0.0, 3.0, 9.0])
    allowed = np.array([False, True, True, True, True])
    first, last, gap, probability = best_span(start, end, allowed)
    assert (first, last) == (2, 4) and gap == pytest.approx(13.0 - 10.0) and 0 < probability < 1
    # An end before its start is never taken, nor a span longer than the limit.
    assert best_span(np.array([0.0, 0.0, 0.0, 9.0]), np.array([0.0, 1.0, 0.0, 0.0]),
                     np.array([False, True, True, True]))[:2] == (3, 3)
    assert best_span(start, end, allowed, max_tokens=2)[:2] == (3, 4)
    assert best_span(start, end, np.zeros(5, dtype=bool)) is None


def test_the_shipped_reader_finds_the_answer_and_says_when_the_passage_has_none() -> None:
    reader = default_reader()
    holds = reader.read("How many points did the Panthers defense give up?", PANTHERS)
    assert holds.text == PANTHERS[holds.start:holds.end] and "308" in holds.text and holds.gap > 0
    lacks = reader.read("What is the boiling point of mercury on Mars in 1850?", PANTHERS)
    assert lacks.gap < 0 < holds.gap and lacks.probability < holds.probability
    # It finds the answer in a passage that starts with the answer's sentence (it was trained on a
    # sentence and the next; the service gives it the best sentence alone).
    pair = PANTHERS[PANTHERS.index("Pro Bowl"):]
    found = reader.read("Who led the team in sacks?", pair, within=pair.index(". ") + 1)
    assert found.text == "Kawann Short" and found.gap > 0
    # ``within``: the span starts in the passage's first sentence, however sure it is of another.
    first = PANTHERS.index(". ") + 1
    limited = reader.read("Who led the team in sacks?", PANTHERS, within=first)
    assert limited.start < first and "Kawann" not in limited.text and limited.gap < found.gap
    assert len(holds.text.split()) <= MAX_ANSWER_TOKENS


def test_the_reading_window_is_where_the_question_terms_are_densest() -> None:
    assert reading_window([True, False, True], 5) == (0, 3)  # it fits: all of it
    assert reading_window([0, 0, 1, 0, 1, 1, 0, 0, 0, 0], 3) == (3, 6)
    assert reading_window([0, 0, 0, 0, 1, 0, 0, 0, 0], 3) == (3, 6)  # a lone match, with its neighbours
    assert reading_window([0] * 10, 4) == (3, 7)  # nothing matched: the middle
    lone_pair = [0] * 40
    lone_pair[1] = lone_pair[38] = 1
    assert reading_window(lone_pair, 10) == (1, 11)  # two matches too far apart: the first, not between
    assert reading_window([0, 0, 0, 0, 0, 0, 0, 0, 1, 0], 4, starts=3) == (1, 5)  # a span may start only early


def test_term_spans_are_the_terms_where_their_words_stand() -> None:
    text = "The Panthers defense gave up just 308 points."
    spans = term_spans(text)
    assert [term for _, _, term in spans] == terms(text)
    assert [text[a:b] for a, b, _ in spans][:3] == ["Panthers", "defense", "gave"]
    assert text[spans[0][0]:spans[0][1]] == "Panthers" and spans[0][2] == "panther"
    assert (question_term_chars("How did the Panthers' defense rank?", text)[[4, 13, 22]] == [True, True, False]).all()


def test_what_is_read_of_a_long_input_is_the_question_and_a_window() -> None:
    question = "Who led the team in sacks?"
    passage = "Filler words about nothing much at all. " * 12 + "Kawann Short led the team in sacks with 11."
    reader = default_reader()
    reader.load()
    encoding = reader._tokenizer.encode(question, passage)
    assert len(encoding.ids) > READ_TOKENS
    kept = read_tokens(question, passage, encoding.sequence_ids, encoding.offsets)
    sequences = [encoding.sequence_ids[i] for i in kept]
    assert len(kept) == READ_TOKENS and kept == sorted(kept)
    assert sequences.count(0) == encoding.sequence_ids.count(0) and sequences.count(None) == 3  # question, specials
    window = [encoding.offsets[i] for i in kept if encoding.sequence_ids[i] == 1]
    assert "Kawann Short led the team in sacks" in passage[window[0][0]:window[-1][1]]
    assert window[0][0] > 0  # the start of the filler is not read
    short = "Kawann Short led the team in sacks."
    every = reader._tokenizer.encode(question, short)
    assert read_tokens(question, short, every.sequence_ids, every.offsets) == list(range(len(every.ids)))
    # Where a span may start only in the first sentence, the window is read there.
    first = passage.index(". ") + 1
    early = read_tokens(question, passage, encoding.sequence_ids, encoding.offsets, within=first)
    assert encoding.offsets[[i for i in early if encoding.sequence_ids[i] == 1][0]][0] < first
    reading = reader.read(question, passage)  # the span is the passage's own text, where it stands
    assert reading.text == passage[reading.start:reading.end] and reading.text.startswith("Kawann")
    assert reading.start == passage.index("Kawann")


def test_a_short_answer_is_a_sure_span_that_answers_and_never_a_pronoun() -> None:
    def sure(text: str, probability: float = 0.9) -> SpanReading:
        return SpanReading(text=text, start=0, end=len(text), gap=5.0, probability=probability)

    assert reader_short_answer("Who led the team in sacks?", sure("Kawann Short")) == "Kawann Short"
    assert reader_short_answer("Who led the team in sacks?", sure("Kawann Short", 0.01)) is None  # not sure
    assert reader_short_answer("Who led the team in sacks?", sure("They")) is None  # a pronoun
    assert reader_short_answer("Who led the team in sacks?", sure("the team")) is None  # the question's words
    assert reader_short_answer("Who led the team in sacks?", sure("11")) is None  # a number for "who"
    assert reader_short_answer("How many sacks did he have?", sure("11,")) == "11"  # trimmed
    assert is_answer_span("Which player stripped the ball?", "Miller")  # a name, though it starts the span
    assert not is_answer_span("When did the war end?", "the treaty")


def test_the_shipped_threshold_and_models_read_the_reader() -> None:
    threshold = shipped_threshold()
    assert 0 < threshold.probability < 1 and "SQuAD v1.1 dev" in threshold.chosen_on
    assert json.loads(files("rag_service.providers.data").joinpath(THRESHOLD_FILE).read_text())["probability"] \
        == threshold.probability
    assert files("rag_service.providers.data").joinpath(GRAPH_FILE).is_file()
    for aligned, names in ((False, FEATURES), (True, ALIGNED_FEATURES)):
        model = default_model(aligned)
        assert model.weights[names.index("reader_gap")] > 0  # a clearer answer, more likely answered


async def test_the_generator_reads_with_the_reader_and_goes_on_without_it_when_it_fails() -> None:
    context = [candidate(PANTHERS, "panthers")]
    question = "Who led the team in sacks?"
    generator = ExtractiveGenerator(reader=default_reader())
    answer = await generator.generate(question, [], context)
    assert answer.answered and answer.answerability["reader_gap"] > 0
    assert answer.short_answer == "Kawann Short"
    assert generator.extract(question, [], context).answerability == answer.answerability  # the same, synchronously

    class Broken:
        def __init__(self, error: ProviderError) -> None:
            self.error, self.calls = error, 0

        def read(self, question, passage, within=None):  # noqa: ANN001, ANN201
            self.calls += 1
            raise self.error

        async def read_async(self, question, passage, within=None):  # noqa: ANN001, ANN201
            return self.read(question, passage, within)

    without = ExtractiveGenerator().extract(question, [], context)
    # A reader that cannot run at all is asked once; one that could not read an input, at every answer.
    unloaded = Broken(ReaderUnavailableError("span reader: could not load span_reader-int8.onnx"))
    one_input = Broken(ProviderError("span reader: could not read this input"))
    for reader, calls in ((unloaded, 1), (one_input, 2)):
        broken = ExtractiveGenerator(reader=reader)
        first, again = await broken.generate(question, [], context), await broken.generate(question, [], context)
        assert reader.calls == calls and "reader_gap" not in first.answerability
        assert first.answerability == again.answerability == without.answerability


async def test_a_second_look_reads_the_runners_up_and_keeps_their_best_gap(local_embedder) -> None:
    """Where the best sentence by shared words is not the answer's, the reader finds the answer in a
    runner-up: the second look's gap is the best of the reads, each read as the best sentence is."""
    context = [candidate(TREATY, "treaty"), candidate(BRONCOS, "broncos")]
    question = "When was the treaty on the river's water rights discussed by the committee in Geneva signed?"
    reader = default_reader()
    generator = ExtractiveGenerator(reader=reader, token_encoder=local_embedder)
    selection = generator._read(generator.select(question, [], context), [])
    assert selection.evidence.best_sentence.startswith("The committee met in Geneva")  # most shared words
    assert selection.runners_up[0].startswith("The agreement was finally signed in 1921")  # the answer's
    assert 0 < len(selection.runners_up) <= SECOND_LOOK_SENTENCES - 1
    assert len(set(selection.runners_up)) == len(selection.runners_up)
    assert selection.evidence.best_sentence not in selection.runners_up
    runner_up = reader.read(question, selection.runners_up[0], len(selection.runners_up[0]))
    assert runner_up.text == "1921" and runner_up.gap > 0 > selection.evidence.reader_gap
    gaps = [reader.read(question, s, len(s)).gap for s in (selection.evidence.best_sentence, *selection.runners_up)]
    assert await generator.best_gap(selection) == max(gaps) == runner_up.gap
    assert selection.evidence.reader_gap_top is None  # the first look does not read them

    at_first = assess(selection.evidence).probability
    first = await generator.generate(question, [], context)
    assert ("reader_gap_top" in first.answerability) == undecided(at_first, generator.abstain_below)
    near = await ExtractiveGenerator(abstain_below=at_first, reader=reader, token_encoder=local_embedder
                                     ).generate(question, [], context)
    assert "reader_gap_top" in near.answerability and "align_mean" in near.answerability
    assert near.answerability["reader_gap_top"] == round(min(max(gaps), READER_GAP_LIMIT), 4)


async def test_a_second_look_without_the_alignment_or_a_runner_up_read_falls_back() -> None:
    """A broken encoder takes no second look at all (the aligned models were trained with the
    alignment on every example), the first time as later; a runner-up the reader cannot read is left
    out of the best gap, and the answer goes on."""

    class BrokenEncoder:
        calls = 0

        async def token_vectors(self, texts):  # noqa: ANN001, ANN202
            BrokenEncoder.calls += 1
            raise ProviderError("could not encode token vectors (onnx): OSError: disk full", stage="embedder")

    context = [candidate(TREATY, "treaty")]
    question = "When was the treaty on the river's water rights discussed by the committee in Geneva signed?"
    reader = default_reader()
    probability = ExtractiveGenerator(reader=reader).extract(question, [], context).answerability["probability"]
    generator = ExtractiveGenerator(abstain_below=probability, token_encoder=BrokenEncoder(), reader=reader)
    first = await generator.generate(question, [], context)
    again = await generator.generate(question, [], context)
    assert BrokenEncoder.calls == 1
    assert "reader_gap_top" not in first.answerability and "align_mean" not in first.answerability
    assert first.answerability == again.answerability == ExtractiveGenerator(
        abstain_below=probability, reader=reader).extract(question, [], context).answerability

    class BestSentenceOnly:
        async def read_async(self, question, passage, within=None):  # noqa: ANN001, ANN201
            if passage.startswith("The agreement"):
                raise ProviderError("span reader: could not read this input", stage="generate")
            return reader.read(question, passage, within)

    shy = ExtractiveGenerator(reader=BestSentenceOnly())
    selection = generator._read(generator.select(question, [], context), [])
    assert await shy.best_gap(selection) == selection.evidence.reader_gap  # the runner-up left out
    assert shy._reader is not None  # one input it could not read does not turn it off


async def test_a_question_too_long_for_the_reader_is_cut_not_refused() -> None:
    """The reader reads at most 160 tokens: a question that long leaves the sentence no room unless
    the question is cut too (the tokenizer refuses to cut the passage alone)."""
    question = "Considering everything said about the defense " * 40 + "who led the team in sacks?"
    reading = default_reader().read(question, PANTHERS)
    assert reading.text in PANTHERS
    answer = await ExtractiveGenerator(reader=default_reader()).generate(question, [], [candidate(PANTHERS, "p")])
    assert "reader_gap" in answer.answerability


def test_a_failed_load_is_remembered(tmp_path) -> None:  # noqa: ANN001
    reader = OnnxSpanReader(tmp_path / "missing.onnx")
    for _ in range(2):
        with pytest.raises(ReaderUnavailableError, match="could not load"):
            reader.read("Who?", "Nobody.")
    assert reader._failed is not None  # the second raise is the remembered error, not a second load


def test_a_question_in_parts_is_not_read() -> None:
    """One span cannot answer two questions: the reader reads single questions only, and for a
    question in parts its gap is unknown to the models (and the pattern model picks short answers)."""
    generator = ExtractiveGenerator(reader=default_reader())
    context = [candidate(PANTHERS, "panthers")]
    parts = ["Who led the team in sacks?", "Where did the team play its home games?"]
    selection = generator.select(" ".join(parts), parts, context)
    assert reader_input(selection, parts) is None and reader_input(selection, [])[0] == " ".join(parts)
    answer = generator.extract(" ".join(parts), parts, context)
    assert answer.answered and "reader_gap" not in answer.answerability


def test_a_statement_is_not_read() -> None:
    """The reader was trained on questions: a claim would read as "no answer" however well the
    passage supports it, so it is not read, and the models read its gap as unknown."""
    generator = ExtractiveGenerator(reader=default_reader())
    context = [candidate(PANTHERS, "panthers")]
    claim = "Kawann Short led the Panthers in sacks."
    assert reader_input(generator.select(claim, [], context), []) is None
    answer = generator.extract(claim, [], context)
    assert "reader_gap" not in answer.answerability and answer.short_answer is None


class FixedSpanReader:
    """Reads SPAN wherever the passage holds it, sure of it: what the generator does with a span."""

    SPAN = "just 308 points, ranking sixth"

    def read(self, question: str, passage: str, within: int | None = None) -> SpanReading:
        at = passage.find(self.SPAN)
        if at < 0:
            return NOTHING_READ
        return SpanReading(text=self.SPAN, start=at, end=at + len(self.SPAN), gap=8.0, probability=0.99)

    async def read_async(self, question: str, passage: str, within: int | None = None) -> SpanReading:
        return self.read(question, passage, within)


async def test_keywords_are_read_for_the_gap_but_get_no_short_answer() -> None:
    """Keywords ask for a fact as a question does, so the reader reads them and the models see its
    gap; but without a question's wording no kind of fact is asked for: no short answer."""
    context = [candidate(PANTHERS, "panthers")]
    keywords = "panthers defense points given up"
    selection = ExtractiveGenerator(reader=default_reader()).select(keywords, [], context)
    assert reader_input(selection, []) == (keywords, selection.evidence.best_sentence,
                                           len(selection.evidence.best_sentence))
    generator = ExtractiveGenerator(abstain_below=0.0, reader=FixedSpanReader())
    typed = await generator.generate(keywords, [], context)
    asked = await generator.generate("How many points did the Panthers defense give up?", [], context)
    assert typed.answered and asked.answered
    assert typed.answerability["reader_gap"] == asked.answerability["reader_gap"] == 8.0
    assert asked.short_answer == FixedSpanReader.SPAN and typed.short_answer is None
    synchronous = generator.extract(keywords, [], context)  # the synchronous path reads alike
    assert synchronous.answerability["reader_gap"] == 8.0 and synchronous.short_answer is None


@pytest.mark.parametrize("text, short", [
    ("Where did the Panthers play their home games?", "Charlotte"),
    ("panthers home games", None),  # keywords: the patterns' span would be "Charlotte"
    ("The Panthers played their home games in Charlotte.", None),  # a statement
])
async def test_only_questions_get_a_short_answer_from_the_patterns(text: str, short: str | None) -> None:
    """Without the reader the patterns pick the short answer, for a question only: keywords and
    statements do not say what kind of fact they want."""
    answer = await ExtractiveGenerator(abstain_below=0.0).generate(text, [], [candidate(PANTHERS, "panthers")])
    assert answer.answered and answer.short_answer == short


async def test_only_a_question_without_the_readers_span_is_parsed_for_the_short_answer() -> None:
    """The parse setting picks the short answer where the reader's span does not give it, and only
    for a question: keywords and statements get none, so they are not parsed."""
    from rag_service.providers.syntax import default_parser

    class CountingParser:
        depth = "entities"

        def __init__(self) -> None:
            self.parser, self.calls = default_parser(self.depth), 0

        def parse(self, texts):  # noqa: ANN001, ANN202 - SyntaxParser's signature
            self.calls += 1
            return self.parser.parse(texts)

        async def parse_async(self, texts):  # noqa: ANN001, ANN202
            self.calls += 1
            return await self.parser.parse_async(texts)

    context = [candidate(PANTHERS, "panthers")]
    question, keywords = "How many points did the Panthers defense give up?", "panthers defense points given up"
    statement = "The Panthers defense gave up 308 points."
    parser = CountingParser()
    reading = ExtractiveGenerator(abstain_below=0.0, reader=FixedSpanReader(), parser=parser)
    for text in (question, keywords, statement):
        await reading.generate(text, [], context)
    assert parser.calls == 0  # the reader's span answers the question; nothing else gets one
    unread = ExtractiveGenerator(abstain_below=0.0, parser=parser)
    for text in (keywords, statement):
        assert (await unread.generate(text, [], context)).short_answer is None
    assert parser.calls == 0
    await unread.generate(question, [], context)
    assert parser.calls == 1


@pytest.mark.parametrize("gap, read", [(NOTHING_READ.gap, -READER_GAP_LIMIT), (40.0, READER_GAP_LIMIT), (3.5, 3.5),
                                       (None, None)])
def test_the_models_read_the_gap_clipped_and_nothing_when_unread(gap: float | None, read: float | None) -> None:
    evidence = Evidence(question="Who led the team in sacks?", best_sentence=PANTHERS, best_chunk=PANTHERS,
                        best_coverage=0.5, other_coverage=0.0, context=[PANTHERS], idf={}, cosines=[],
                        reader_gap=gap)
    value = features(evidence)[FEATURES.index("reader_gap")]
    assert (np.isnan(value) if read is None else value == read)
