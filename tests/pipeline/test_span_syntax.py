"""The parse behind short answers: spaCy's shipped English pipeline, and the pure features read
from it (span_syntax.py)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rag_service.config import Settings
from rag_service.domain import ParseDepth, Word
from rag_service.errors import ProviderError
from rag_service.pipeline.generation.extractive import ExtractiveGenerator
from rag_service.pipeline.generation.span_syntax import entity_kind, reading, syntax_features, wh_role
from rag_service.pipeline.generation.spans import (
    ENTITIES_MODEL_FEATURES,
    PARSED_FEATURES,
    ShortAnswerModel,
    _without_lead,
    candidates,
    parse_for_short_answer,
    scored_candidates,
    span_features,
)
from rag_service.providers.syntax import SpacyParser, default_parser
from rag_service.text.questions import focus

SENTENCE = "Microsoft CEO Satya Nadella announced on 7 January 2016 that 1,200 workers would move to Seattle."


def test_the_parser_gives_entities_words_and_noun_chunks_by_offsets() -> None:
    (parsed,) = default_parser().parse([SENTENCE])
    entities = {(SENTENCE[e.start:e.end], e.label) for e in parsed.entities}
    assert {("Satya Nadella", "PERSON"), ("Seattle", "GPE"), ("7 January 2016", "DATE")} <= entities
    assert all(SENTENCE[w.start:w.end] == w.text for w in parsed.words)
    roots = [i for i, w in enumerate(parsed.words) if w.head == i]
    assert len(roots) == 1 and parsed.words[roots[0]].text == "announced"
    nadella = next(i for i, w in enumerate(parsed.words) if w.text == "Nadella")
    assert parsed.ancestors(nadella) == [roots[0]]  # the subject of "announced"
    assert all(SENTENCE[s:e].strip() == SENTENCE[s:e] for s, e in parsed.noun_chunks)


def test_a_missing_model_is_a_provider_error_naming_the_stage() -> None:
    with pytest.raises(ProviderError, match="no_such_model") as raised:
        SpacyParser("no_such_model").parse(["A sentence."])
    assert raised.value.stage == "generation" and "rag-service[parse]" in raised.value.message


def test_any_load_or_parse_failure_is_a_provider_error_and_a_failed_load_is_not_retried(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import spacy

    loads = []

    def unreadable(*args: object, **kwargs: object) -> None:
        loads.append(args)
        raise ValueError("config.cfg: unknown architecture")

    monkeypatch.setattr(spacy, "load", unreadable)
    parser = SpacyParser()
    for _ in range(2):
        with pytest.raises(ProviderError, match="unknown architecture"):
            parser.parse(["A sentence."])
    assert len(loads) == 1

    class Broken:
        def pipe(self, texts: list[str]) -> None:
            raise ValueError("bad input")

    monkeypatch.setattr(spacy, "load", lambda *args, **kwargs: Broken())
    with pytest.raises(ProviderError, match="parsing failed: ValueError: bad input"):
        SpacyParser().parse(["A sentence."])


async def test_parses_run_on_the_parsers_own_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    parser, threads = default_parser(), []
    parse = parser.parse
    monkeypatch.setattr(parser, "parse", lambda texts: threads.append(threading.current_thread().name) or parse(texts))
    (parsed,) = await parser.parse_async(["A sentence."])
    assert parsed.text == "A sentence." and threads[0].startswith("syntax-parser")


@pytest.mark.parametrize("question, role", [
    ("Who founded the company?", "subject"),
    ("What did Tesla invent?", "object"),
    ("Which team won the game?", "subject"),  # "which team" fills the noun's role
    ("Where did he die?", "oblique"),
    ("The company was founded by whom?", "oblique"),
    ("Which of them is larger?", None),  # "which" hangs on the root: no role to fill
])
def test_the_wh_words_role(question: str, role: str | None) -> None:
    (parsed,) = default_parser().parse([question])
    assert wh_role(parsed) == role


def test_entity_kinds() -> None:
    assert entity_kind("PERSON") == entity_kind("GPE") == "name"
    assert entity_kind("DATE") == "date" and entity_kind("CARDINAL") == entity_kind("MONEY") == "number"


def test_the_parse_finds_the_name_inside_a_longer_capitalised_run() -> None:
    question = "Who announced that the workers would move?"
    parsed = parse_for_short_answer(question, SENTENCE, default_parser())
    assert parsed is not None
    plain = {c.text for c in candidates(SENTENCE, question)}
    with_parse = {c.text: c for c in candidates(SENTENCE, question, parsed[1])}
    assert "Satya Nadella" not in plain and "Microsoft CEO Satya Nadella" in plain
    assert with_parse["Satya Nadella"].syntax_only and not with_parse["Microsoft CEO Satya Nadella"].syntax_only


def test_the_subject_of_the_asked_verb_reads_as_the_answer_to_who() -> None:
    question, sentence = "Who led the team in sacks?", "Pro Bowl tackle Kawann Short led the team in sacks with 11."
    parsed = parse_for_short_answer(question, sentence, default_parser())
    assert parsed is not None
    asked = focus(question)
    at = sentence.index("Kawann Short")
    person = syntax_features(at, at + len("Kawann Short"), "Kawann Short", reading(*parsed, asked), False)
    assert person["entity_match"] == person["subject"] == person["wh_role"] == person["verb_match"] == 1.0
    assert person["head_is_anchor"] == 1.0 and person["entity_mismatch"] == 0.0
    at = sentence.index("11")
    count = syntax_features(at, at + 2, "11", reading(*parsed, asked), False)
    assert count["entity_mismatch"] == 1.0 and count["subject"] == 0.0 and count["wh_role"] == 0.0
    assert count["tree_distance"] > person["tree_distance"]
    assert scored_candidates(question, sentence, parsed=parsed)[0][0].text == "Kawann Short"


def test_a_clause_question_is_not_parsed() -> None:
    sentence = "The sky is blue because of scattering."
    assert parse_for_short_answer("Why is the sky blue?", sentence, default_parser()) is None


@pytest.mark.parametrize("depth, question", [
    ("full", "Who announced that 1,200 workers would move to Seattle?"),  # the subject of the asked verb
    ("full", "Who is the CEO of Microsoft?"),
    ("entities", "Who is the CEO of Microsoft?"),
])
async def test_the_generator_with_a_parser_finds_what_only_the_parse_can(depth: ParseDepth, question: str) -> None:
    """With a parser (RAGSVC_ANSWER_SHORT_ANSWER_PARSE) the name inside "Microsoft CEO Satya
    Nadella" can be the short answer; without one it is not a candidate at all."""
    from tests.pipeline.test_generation import candidate

    context = [candidate(SENTENCE, "nadella")]
    plain = await ExtractiveGenerator(abstain_below=0.0).generate(question, [], context)
    parser = default_parser(depth)
    parsed = await ExtractiveGenerator(abstain_below=0.0, parser=parser).generate(question, [], context)
    assert plain.short_answer != "Satya Nadella"
    assert parsed.short_answer == "Satya Nadella"
    assert ExtractiveGenerator(abstain_below=0.0, parser=parser).extract(
        question, [], context).short_answer == "Satya Nadella"  # the synchronous path parses too


@pytest.mark.parametrize("spelled, depth", [
    ("true", "full"), ("TRUE", "full"), ("1", "full"), ("yes", "full"), ("t", "full"), ("on", "full"),
    ("false", "off"), ("0", "off"), ("no", "off"), ("off", "off"),
    ("entities", "entities"), (" Entities ", "entities"), ("FULL", "full"),
])
def test_the_setting_read_from_the_environment_and_true_still_means_the_full_parse(
        monkeypatch: pytest.MonkeyPatch, spelled: str, depth: str) -> None:
    monkeypatch.setenv("RAGSVC_ANSWER_SHORT_ANSWER_PARSE", spelled)
    assert Settings().answer_short_answer_parse == depth


def test_the_parse_is_off_by_default() -> None:
    assert Settings().answer_short_answer_parse == "off"
    assert Settings(answer_short_answer_parse=True).answer_short_answer_parse == "full"
    assert Settings(answer_short_answer_parse=0).answer_short_answer_parse == "off"
    with pytest.raises(ValidationError, match="'off', 'entities' or 'full'"):
        Settings(answer_short_answer_parse="deep")


def test_the_entities_depth_gives_the_entities_alone() -> None:
    parser = default_parser("entities")
    (parsed,) = parser.parse([SENTENCE])
    entities = {(SENTENCE[e.start:e.end], e.label) for e in parsed.entities}
    assert {("Satya Nadella", "PERSON"), ("Seattle", "GPE"), ("7 January 2016", "DATE")} <= entities
    assert not parsed.tree and parsed.noun_chunks == ()
    assert all(w.head == i and w.dep == "" for i, w in enumerate(parsed.words))
    assert all(SENTENCE[w.start:w.end] == w.text for w in parsed.words)


def test_at_the_entities_depth_only_the_sentence_is_parsed_and_only_entity_features_are_read(
        monkeypatch: pytest.MonkeyPatch) -> None:
    parser, seen = default_parser("entities"), []
    parse = parser.parse
    monkeypatch.setattr(parser, "parse", lambda texts: seen.append(texts) or parse(texts))
    question = "Who announced that the workers would move?"
    parsed = parse_for_short_answer(question, SENTENCE, parser)
    assert parsed is not None and parsed[0] is None and seen == [[SENTENCE]]
    spans = candidates(SENTENCE, question, parsed[1])
    nadella = next(s for s in spans if s.text == "Satya Nadella")
    read = reading(*parsed, focus(question))
    row = dict(zip(ENTITIES_MODEL_FEATURES, span_features(nadella, spans, SENTENCE, focus(question), 1.0, read),
                   strict=True))
    assert row["entity"] == row["entity_match"] == row["syntax_only"] == 1.0 and row["entity_mismatch"] == 0.0
    assert ShortAnswerModel.for_parse(parsed) == ShortAnswerModel.default("entities")


def _unlabelled(*texts: str) -> list[Word]:
    return [Word(start=i, end=i + 1, text=t, pos="", tag="", dep="", head=i) for i, t in enumerate(texts)]


def test_without_the_tree_an_entitys_leading_article_goes_by_its_spelling_and_a_currency_sign_stays() -> None:
    def kept(*texts: str) -> list[str]:
        return [w.text for w in _without_lead(_unlabelled(*texts), chunk=False)]

    assert kept("the", "Carolina", "Panthers") == ["Carolina", "Panthers"]
    assert kept("An", "Open", "Letter") == ["Open", "Letter"]
    assert kept("“", "Hey", "Jude") == ["Hey", "Jude"]
    assert kept("$", "1.3", "billion") == ["$", "1.3", "billion"]
    assert kept("") == [""]  # an empty word (a hand-made parse) is neither
    # Through the recogniser: "$1.3 billion" (MONEY) adds no "1.3 billion" beside the pattern's span.
    question, sentence = "How much did the stadium cost?", "The stadium cost $1.3 billion to build."
    parsed = parse_for_short_answer(question, sentence, default_parser("entities"))
    assert parsed is not None and any(sentence[e.start:e.end] == "$1.3 billion" for e in parsed[1].entities)
    texts = [c.text for c in candidates(sentence, question, parsed[1])]
    assert "$1.3 billion" in texts and "1.3 billion" not in texts


def test_a_question_parse_without_the_sentences_tree_is_read_as_entities_alone() -> None:
    """Whatever a parser hands back, the tree's features are read only when both parses have it."""
    question = "Who announced that the workers would move?"
    (sentence,) = default_parser("full").parse([SENTENCE])
    (entities_only,) = default_parser("entities").parse([SENTENCE])
    (asked,) = default_parser("full").parse([question])
    for pair in ((None, sentence), (asked, entities_only), (None, entities_only)):
        assert not reading(*pair, focus(question)).tree
        assert ShortAnswerModel.for_parse(pair) == ShortAnswerModel.default("entities")
        assert scored_candidates(question, SENTENCE, parsed=pair)  # scored, no tree needed
    assert reading(asked, sentence, focus(question)).tree
    assert ShortAnswerModel.for_parse((asked, sentence)) == ShortAnswerModel.default("full")
    assert default_parser() is default_parser("full")  # one full parser per process


async def test_a_parser_that_fails_leaves_the_short_answer_to_the_plain_model(caplog: pytest.LogCaptureFixture) -> None:
    from tests.pipeline.test_generation import candidate

    broken = SpacyParser("no_such_model")
    calls = []
    parse = broken.parse
    broken.parse = lambda texts: calls.append(texts) or parse(texts)  # type: ignore[method-assign]
    context = [candidate("Pro Bowl tackle Kawann Short led the team in sacks with 11.", "panthers")]
    generator = ExtractiveGenerator(abstain_below=0.0, parser=broken)
    question = "Who led the team in sacks?"
    first = await generator.generate(question, [], context)
    again = await generator.generate(question, [], context)
    plain = await ExtractiveGenerator(abstain_below=0.0).generate(question, [], context)
    assert first.short_answer == again.short_answer == plain.short_answer == "Kawann Short"
    assert len(calls) == 1 and "no_such_model" in caplog.text  # tried once, logged, not asked again


def test_parse_candidates_drop_leading_articles_possessives_and_repeat_no_pattern() -> None:
    question = "Who lost the final game?"
    sentence = "The Carolina Panthers lost to Denver's defense in the final game."
    parsed = parse_for_short_answer(question, sentence, default_parser())
    assert parsed is not None
    texts = [c.text for c in candidates(sentence, question, parsed[1])]
    assert not any(t.startswith(("s ", "'s", "’s")) for t in texts)  # "Denver['s] defense"
    assert "Denver" in texts  # the possessor is the entity's own word: kept
    assert all(t in sentence for t in texts)
    # spaCy keeps the article inside this entity ("the Carolina Panthers", ORG): it is the pattern's span.
    question, sentence = "Who did the Broncos play?", "In the game, the Broncos played against the Carolina Panthers."
    parsed = parse_for_short_answer(question, sentence, default_parser())
    assert parsed is not None
    assert any(sentence[e.start:e.end] == "the Carolina Panthers" for e in parsed[1].entities)
    texts = [c.text for c in candidates(sentence, question, parsed[1])]
    assert texts.count("Carolina Panthers") == 1 and not any(t.lower().startswith("the ") for t in texts)


def test_a_name_before_a_full_stop_is_read_as_its_entity() -> None:
    """The pattern's match of "Seattle." holds the full stop; the entity is read at "Seattle"."""
    question = "Where would the workers move?"
    parsed = parse_for_short_answer(question, SENTENCE, default_parser())
    assert parsed is not None
    spans = candidates(SENTENCE, question, parsed[1])
    seattle = next(s for s in spans if s.text == "Seattle")
    assert SENTENCE[seattle.start:seattle.end] != "Seattle"  # the raw match is longer
    read = reading(*parsed, focus(question))
    row = dict(zip(PARSED_FEATURES, span_features(seattle, spans, SENTENCE, focus(question), 1.0, read), strict=True))
    assert row["entity"] == row["entity_match"] == 1.0 and row["entity_mismatch"] == 0.0


def test_a_number_whose_unit_the_question_names_is_read_with_its_unit() -> None:
    """The answer is "2,300" (the question names the miles), the entity "2,300 miles" (QUANTITY)."""
    question, sentence = "How many miles long is the river?", "The river is 2,300 miles long."
    parsed = parse_for_short_answer(question, sentence, default_parser())
    assert parsed is not None
    spans = candidates(sentence, question, parsed[1])
    number = next(s for s in spans if s.text == "2,300")
    read = reading(*parsed, focus(question))
    row = dict(zip(PARSED_FEATURES, span_features(number, spans, sentence, focus(question), 1.0, read), strict=True))
    assert row["entity_match"] == 1.0


async def test_an_abstained_answer_is_not_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.pipeline.test_generation import candidate

    parser, seen = default_parser(), []
    parse = parser.parse
    monkeypatch.setattr(parser, "parse", lambda texts: seen.append(texts) or parse(texts))
    context = [candidate("Pro Bowl tackle Kawann Short led the team in sacks with 11.", "panthers")]
    declined = await ExtractiveGenerator(abstain_below=1.0, parser=parser).generate(
        "What is the boiling point of mercury on Mars?", [], context)
    assert not declined.answered and declined.short_answer is None and seen == []
    answered = await ExtractiveGenerator(abstain_below=0.0, parser=parser).generate(
        "Who led the team in sacks?", [], context)
    assert answered.short_answer == "Kawann Short" and len(seen) == 1
