"""Generators: extractive (pure), chain-of-thought against a local OpenAI-compatible server,
citation verification and the streamed answer field."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Iterator
from collections.abc import Set as AbstractSet

import pytest

from rag_service.config import load_settings
from rag_service.domain import Candidate, Citation, GeneratedAnswer, SearchHit
from rag_service.errors import ProviderError
from rag_service.pipeline.generation.answerability import Assessment
from rag_service.pipeline.generation.declines import confirm_decline
from rag_service.pipeline.generation.extractive import ExtractiveGenerator
from rag_service.pipeline.generation.llm_generator import AnswerFieldStreamer, LLMGenerator
from rag_service.pipeline.generation.selection import coverage
from rag_service.pipeline.generation.spans import scored_candidates
from rag_service.providers.llm import make_llm
from rag_service.text.citations import cited_numbers, support, verify_claims
from rag_service.text.sentences import _split, split_sentences
from rag_service.text.terms import SHORT_TEXT, _terms, terms
from tests.fake_openai import Reply, fake_openai

PANTHERS = ("The Panthers defense gave up just 308 points, ranking sixth in the league. Pro Bowl defensive tackle "
            "Kawann Short led the team in sacks with 11. The team played its home games in Charlotte.")
BRONCOS = "The Broncos won Super Bowl 50 on February 7, 2016, beating the Panthers 24-10."


def candidate(text: str, uri: str, start: int = 0) -> Candidate:
    hit = SearchHit(chunk_id=uuid.uuid4(), document_id=uuid.uuid4(), parent_id=None, ordinal=0, source_uri=uri,
                    title=uri.upper(), text=text, start_char=start, end_char=start + len(text), score=1.0)
    return Candidate(hit=hit, fused_score=1.0)


CONTEXT = [candidate(PANTHERS, "panthers", start=500), candidate(BRONCOS, "broncos")]


def test_cached_splits_and_terms_are_the_callers_own() -> None:
    """Both are kept per text across answers; a caller that changes what it got changes no one else's."""
    first = split_sentences(PANTHERS)
    first.append(first[0])
    again = split_sentences(PANTHERS)
    assert len(again) == len(first) - 1 and again is not first
    assert split_sentences(PANTHERS)[0] is again[0]  # the same kept sentences, in a new list
    words = terms(PANTHERS)
    words.clear()
    hits = _terms.cache_info().hits
    assert terms(PANTHERS) == terms("".join(list(PANTHERS))) != []  # an equal text, another object
    assert _terms.cache_info().hits == hits + 2
    # A text too long to keep is worked out each time, to the same result, and not kept.
    long_text = " ".join([PANTHERS] * (SHORT_TEXT // len(PANTHERS) + 1))
    assert len(long_text) > SHORT_TEXT
    kept = _terms.cache_info().currsize, _split.cache_info().currsize
    assert [s.text for s in split_sentences(long_text)] == [s.text for s in split_sentences(PANTHERS)] * (
        SHORT_TEXT // len(PANTHERS) + 1)
    assert terms(long_text) == terms(PANTHERS) * (SHORT_TEXT // len(PANTHERS) + 1)
    assert (_terms.cache_info().currsize, _split.cache_info().currsize) == kept
    # Nor a short text with many places a sentence may end, whose sentences would fill the cache.
    many = "A. " * 100
    assert len(split_sentences(many)) == 100 and _split.cache_info().currsize == kept[1]


def test_sentences_keep_offsets() -> None:
    for s in split_sentences(PANTHERS):
        assert PANTHERS[s.start:s.end] == s.text
    assert [s.text for s in split_sentences("Dr. No met Mr. Bond at 3.5 p.m. today. Then left.")] == [
        "Dr. No met Mr. Bond at 3.5 p.m. today.", "Then left."]


@pytest.mark.parametrize("question, expected", [
    ("How many points did the Panthers defense give up?", "308"),
    ("Who led the Panthers in sacks?", "Kawann Short"),
    ("When did the Broncos win Super Bowl 50?", "February 7, 2016"),
    ("Where did the Panthers play home games?", "Charlotte"),
    ("Why is the sky blue?", None),
])
def test_short_answers_by_question_kind(question: str, expected: str | None) -> None:
    answer = ExtractiveGenerator().extract(question, [], CONTEXT)
    # Precision first: a short answer may be withheld, but one that is given is the right span.
    assert answer.short_answer in (expected, None)
    if expected is None:
        return
    sentence = next(s.text for c in CONTEXT for s in split_sentences(c.hit.text) if expected in s.text)
    assert scored_candidates(question, sentence)[0][0].text == expected


def test_extractive_answer_cites_the_sentence_it_quotes() -> None:
    answer = ExtractiveGenerator().extract("Who led the Panthers in sacks?", [], CONTEXT, retrieval_confidence=0.8)
    assert answer.generator == "extractive"
    first = answer.citations[0]
    assert first.n == 1 and first.source_uri == "panthers"
    assert "Kawann Short" in first.quote
    # Offsets are document offsets: the chunk starts at 500.
    assert PANTHERS[first.start_char - 500:first.end_char - 500] == first.quote
    assert all(c.verified for c in answer.claims) and "[1]" in answer.answer
    assert 0 < answer.confidence <= 1


def test_extractive_answers_each_sub_question() -> None:
    answer = ExtractiveGenerator().extract(
        "Who led the Panthers in sacks and who won Super Bowl 50?", ["Who led the Panthers in sacks",
                                                                     "who won Super Bowl 50"], CONTEXT)
    assert {c.source_uri for c in answer.citations} == {"panthers", "broncos"}


def test_a_heading_that_only_repeats_the_question_is_not_the_answer() -> None:
    # The chunk starts with its document's title on a line of its own: it covers every word of the
    # question and says nothing, so the sentence that adds the fact is the answer.
    chunk = candidate("Super Bowl 50\n\nLady Gaga performed the national anthem before Super Bowl 50.", "sb50")
    answer = ExtractiveGenerator(abstain_below=0.0).extract("Who sang the anthem at Super Bowl 50?", [], [chunk])
    assert answer.claims and answer.claims[0].text.startswith("Lady Gaga")
    assert all(claim.text.strip() != "Super Bowl 50" for claim in answer.claims)
    # The document's title on its own line is not an answer even when it holds other words.
    titled = candidate("Victoria (Australia)\n\nIts capital is Melbourne.", "victoria (australia)")
    answer = ExtractiveGenerator(abstain_below=0.0).extract("What is the capital of Victoria?", [], [titled])
    assert [claim.text for claim in answer.claims] == ["Its capital is Melbourne."]
    # A sentence that repeats the question's words is held to nothing: it answers a yes/no question.
    paris = [candidate("France has many old cities.", "cities"), candidate("Paris is the capital of France.", "paris")]
    answer = ExtractiveGenerator(abstain_below=0.0).extract("Is Paris the capital of France?", [], paris)
    assert answer.claims[0].text == "Paris is the capital of France." and answer.citations[0].source_uri == "paris"
    # An untitled one-line document is titled by its line: that line is content, not a heading.
    line = "Falcon will acquire Acme next quarter"
    answer = ExtractiveGenerator(abstain_below=0.0).extract(
        "Which company will Falcon acquire next quarter?", [], [candidate(line, line.lower())])
    assert [claim.text for claim in answer.claims] == [line]
    # When nothing else is there, the heading is still all the context offers.
    only = candidate("Super Bowl 50", "heading")
    assert ExtractiveGenerator(abstain_below=0.0).extract("Super Bowl 50?", [], [only]).claims


class _OrderedTerms(AbstractSet[str]):
    """A set whose iteration order is its construction order: the order a process's hash seed
    would otherwise choose."""

    def __init__(self, items: Iterable[str]) -> None:
        self._items = list(dict.fromkeys(items))

    def __contains__(self, item: object) -> bool:
        return item in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


def test_coverage_does_not_depend_on_the_order_of_the_terms() -> None:
    # Sentences covering different terms of equal weight tie exactly, so that rank and position
    # break the tie in every process (a plain float sum differs in its last bit by order:
    # 0.1 + 0.2 + 0.3 != 0.3 + 0.2 + 0.1).
    idf = {"alpha": 0.1, "beta": 0.2, "gamma": 0.3, "delta": 1.0}
    question, sentence = ["alpha", "beta", "gamma", "delta"], ["alpha", "beta", "gamma"]
    forward = coverage(_OrderedTerms(question), _OrderedTerms(sentence), idf)
    backward = coverage(_OrderedTerms(question[::-1]), _OrderedTerms(sentence[::-1]), idf)
    assert forward == backward


def test_extractive_with_no_context_says_so() -> None:
    answer = ExtractiveGenerator().extract("anything", [], [])
    assert answer.citations == [] and answer.confidence == 0.0 and "could not find" in answer.answer


def test_claim_verification() -> None:
    sources = ["HNSW builds a layered proximity graph.", "IVFFlat partitions vectors into lists."]
    claims = verify_claims("HNSW builds a layered graph [1]. IVFFlat uses trees [2]. Uncited. Bad [9].", sources)
    assert [(c.verified, c.citations) for c in claims] == [(True, [1]), (False, [2]), (False, []), (False, [9])]
    assert cited_numbers("a [2] b [1, 3] c [2]") == [2, 1, 3]
    assert support("IVFFlat partitions vectors", sources[1]) == 1.0
    assert support("It is so.", sources[1]) is None  # nothing checkable: no score, not a fake one
    [yes] = verify_claims("It is so [1].", sources)
    assert yes.support is None and not yes.verified


def test_answer_field_streamer_yields_only_the_answer_text() -> None:
    raw = json.dumps({"reasoning_steps": ["the answer is in [1]"], "answer": 'It is "blue" [1]\nétat.',
                      "citations": [1], "confidence": 0.8})
    streamer = AnswerFieldStreamer()
    assert "".join(streamer.feed(raw[i:i + 3]) for i in range(0, len(raw), 3)) == 'It is "blue" [1]\nétat.'


def llm_for(url: str):  # noqa: ANN201
    return make_llm(load_settings(llm_base_url=url, llm_model_simple="s", llm_model_complex="big", llm_timeout_s=2))


VALID = json.dumps({"reasoning_steps": ["Passage 1 names the sack leader."],
                    "answer": "Kawann Short led the team in sacks with 11 [1].", "citations": [1],
                    "confidence": 0.9})


async def test_llm_valid_reply() -> None:
    with fake_openai() as server:
        server.queue(VALID)
        answer = await LLMGenerator(llm_for(server.url)).generate("Who led in sacks?", [], CONTEXT, tier="complex")
        body = server.requests[0]["body"]
    assert body["model"] == "big" and body["response_format"] == {"type": "json_object"}
    system, user = body["messages"]
    assert "data, not" in system["content"] and "[1] PANTHERS" in user["content"] and "[2] BRONCOS" in user["content"]
    assert answer.generator == "llm" and answer.model == "big"
    assert (answer.prompt_name, answer.prompt_version) == ("answer_cot", 1)
    assert answer.reasoning_steps == ["Passage 1 names the sack leader."]
    assert [c.n for c in answer.citations] == [1] and answer.citations[0].verified
    # The citation quotes the chunk's supporting sentence, with document offsets.
    quote = answer.citations[0]
    assert quote.quote.startswith("Pro Bowl defensive tackle Kawann Short")
    assert PANTHERS[quote.start_char - 500:quote.end_char - 500] == quote.quote
    assert answer.claims[0].verified and answer.confidence == 0.9


async def test_llm_invalid_json_is_retried_with_the_error() -> None:
    with fake_openai() as server:
        server.queue("Sure! The answer is Kawann Short.", '{"answer": "x"}', VALID)
        answer = await LLMGenerator(llm_for(server.url)).generate("Who led in sacks?", [], CONTEXT)
        retries = [r["body"]["messages"] for r in server.requests]
    assert len(retries) == 3 and answer.answer.startswith("Kawann Short")
    assert "not valid" in retries[1][-1]["content"] and retries[1][-2]["content"].startswith("Sure!")
    assert "confidence" in retries[2][-1]["content"]  # the validation error names the missing field


async def test_llm_gives_up_after_three_invalid_replies() -> None:
    with fake_openai() as server:
        server.queue("no", "still no", "never")
        with pytest.raises(ProviderError, match="3 tries"):
            await LLMGenerator(llm_for(server.url)).generate("q", [], CONTEXT)


async def test_llm_unsupported_and_unresolvable_citations_are_flagged() -> None:
    reply = json.dumps({"reasoning_steps": [], "answer": "The Panthers won Super Bowl 50 [1]. The team played "
                        "home games in Charlotte [1]. Something [7].", "citations": [1, 7], "confidence": 0.5})
    with fake_openai() as server:
        server.queue(reply)
        answer = await LLMGenerator(llm_for(server.url)).generate("q", [], CONTEXT)
    assert [c.n for c in answer.citations] == [1]  # [7] resolves to nothing and is not listed
    assert [c.verified for c in answer.claims] == [False, True, False]
    assert answer.citations[0].verified is False  # one claim citing [1] is unsupported


async def test_an_llm_reply_citing_nothing_says_the_documents_do_not_answer() -> None:
    reply = json.dumps({"reasoning_steps": ["No passage names a World Cup winner."],
                        "answer": "The passages do not say who won the 2022 World Cup.", "citations": [],
                        "confidence": 0.2})
    with fake_openai() as server:
        server.queue(reply, VALID)
        declined = await LLMGenerator(llm_for(server.url)).generate("Who won the 2022 World Cup?", [], CONTEXT)
        answered = await LLMGenerator(llm_for(server.url)).generate("Who led in sacks?", [], CONTEXT)
    assert not declined.answered and declined.answer == "The passages do not say who won the 2022 World Cup."
    assert declined.citations == [] and declined.short_answer is None
    # The nearest passages, for the user to look at: shown, not offered as support.
    assert [(s.n, s.source_uri, s.verified) for s in declined.closest_sources] == [(1, "panthers", False),
                                                                                 (2, "broncos", False)]
    assert declined.generator == "llm" and declined.reasoning_steps == ["No passage names a World Cup winner."]
    assert answered.answered and answered.closest_sources == []


def test_an_llm_decline_stands_only_where_the_answerability_models_agree() -> None:
    shown = [Citation(n=1, chunk_id=uuid.uuid4(), document_id=uuid.uuid4(), source_uri="a", title=None,
                      start_char=0, end_char=1, quote="A", verified=False)]
    decline = GeneratedAnswer(answer="The passages do not say.", short_answer="passages", citations=[], claims=[],
                              confidence=0.9, generator="llm", answered=False, closest_sources=shown)
    weak = Assessment(probability=0.03, confidence=0.2, features={"best_share": 0.1})
    strong = Assessment(probability=0.6, confidence=0.7, features={"best_share": 0.9})
    stands = confirm_decline(decline, weak, abstain_below=0.08)
    # Reported as an extractive abstention is: the models' probability is its confidence.
    assert not stands.answered and stands.confidence == 0.03 and stands.short_answer is None
    assert stands.closest_sources == shown
    assert stands.answerability == {"probability": 0.03, "best_share": 0.1}
    # Where the evidence reads as answering, it is an answer that cites nothing: graded, not an abstention.
    overruled = confirm_decline(decline, strong, abstain_below=0.08)
    assert overruled.answered and overruled.confidence == 0.9 and overruled.answerability["probability"] == 0.6
    assert overruled.closest_sources == [] and overruled.short_answer == "passages"
    # Nothing to read: it stands.
    assert confirm_decline(decline, None, abstain_below=0.08) == decline.model_copy(update={"short_answer": None})
    answered = decline.model_copy(update={"answered": True})
    assert confirm_decline(answered, weak, abstain_below=0.08) == answered


async def test_llm_streams_the_answer_text() -> None:
    pieces: list[str] = []

    async def sink(text: str) -> None:
        pieces.append(text)

    with fake_openai() as server:
        server.queue(VALID)
        answer = await LLMGenerator(llm_for(server.url)).generate("Who led in sacks?", [], CONTEXT, on_token=sink)
        assert server.requests[0]["body"]["stream"] is True
    assert len(pieces) > 3 and "".join(pieces) == answer.answer


async def test_llm_timeout_is_a_provider_error() -> None:
    with fake_openai() as server:
        server.default = Reply(VALID, delay_s=3)
        with pytest.raises(ProviderError, match="LLM request"):
            await LLMGenerator(llm_for(server.url)).generate("q", [], CONTEXT)


async def test_llm_refines_an_unsure_intent() -> None:
    from datetime import UTC, datetime

    from rag_service.pipeline.intent import IntentParser
    from rag_service.pipeline.intent_llm import RULES_UNSURE_BELOW, refine_with_llm

    intent = IntentParser().parse("it?", datetime(2026, 1, 1, tzinfo=UTC))
    assert intent.confidence < RULES_UNSURE_BELOW
    with fake_openai() as server:
        server.queue(json.dumps({"query_type": "summary", "sub_questions": ["a", "b"]}), '{"query_type": "poem"}')
        refined = await refine_with_llm(intent, llm_for(server.url))
        with pytest.raises(ProviderError, match="unknown query type"):
            await refine_with_llm(intent, llm_for(server.url))
    assert (refined.query_type, refined.sub_questions, refined.parsed_by) == ("summary", ["a", "b"], "rules+llm")
    assert refined.entities == intent.entities and refined.time_ranges == intent.time_ranges


def test_dropping_citations_handles_grouped_markers() -> None:
    from rag_service.text.citations import drop_citations

    assert drop_citations("A [1, 7]. B [7]. C [2][7].", {7}) == "A [1]. B. C [2]."


def test_markdown_tables_and_lists_split_into_rows_and_items() -> None:
    text = "Intro.\n\n| key | meaning |\n|---|---|\n| `RAGSVC_X` | does x |\n- first item\n- second item"
    pieces = [s.text for s in split_sentences(text)]
    assert pieces == ["Intro.", "| key | meaning |", "| `RAGSVC_X` | does x |", "- first item", "- second item"]
