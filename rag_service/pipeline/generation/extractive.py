"""The extractive generator (no LLM): it answers with the retrieved sentences that best answer
the question (and each sub-question), in reading order, each cited [n], with a short answer span
when one is likely enough: the span reader's (read_answers.py), or without a reader the pattern
model's (spans.py). When the answerability model (answerability.py, which reads the span reader's
"no answer" too; near its threshold and below it, with a second look: the question's token
alignment to the best passage, alignment.py, and the reader on the runners-up) finds the retrieved
evidence does not answer the question, it says so instead and lists the closest passages. An
answer's confidence comes from the calibrated confidence model; a "does not answer" reports the
answerability probability."""

from __future__ import annotations

import asyncio
import logging
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from rag_service.domain import Candidate, Citation, Complexity, GeneratedAnswer, SpanReading
from rag_service.domain.prompts import PromptVersion
from rag_service.errors import ProviderError
from rag_service.pipeline.generation.alignment import alignment, passage
from rag_service.pipeline.generation.answerability import Assessment, Evidence, assess, undecided
from rag_service.pipeline.generation.declines import closest_sources, shown
from rag_service.pipeline.generation.read_answers import reader_short_answer
from rag_service.pipeline.generation.spans import (
    ShortAnswerParse,
    parse_for_short_answer,
    parse_for_short_answer_async,
    short_answer,
)
from rag_service.pipeline.generation.tokens import TokenSink
from rag_service.providers.embeddings import TokenEncoder
from rag_service.providers.reader import ReaderUnavailableError, SpanReader
from rag_service.providers.syntax import SyntaxParser
from rag_service.text.citations import verify_claims
from rag_service.text.questions import is_question
from rag_service.text.sentences import Sentence, split_sentences
from rag_service.text.terms import terms

MAX_SENTENCES = 3
# A second look reads this many of the best-scoring sentences (the best, read already, and its
# runners-up): out of fold on XQuAD, 2 to 5 did about as well (docs/benchmarks.md), and each read
# costs about 5 ms; three runners-up put the answers that take the second look past the p95.
SECOND_LOOK_SENTENCES = 2
SUPPORT_RATIO = 0.6
_RANK_PRIOR = 0.15
PROMPT_NAME = "answer_extractive"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Scored:
    context: int           # 1-based context number
    sentence: Sentence
    score: float


@dataclass(frozen=True)
class Selection:
    sentences: list[_Scored]  # in reading order
    best: str                 # the best-scoring sentence's text (where a short answer is looked for)
    evidence: Evidence        # what the answerability models read (the alignment only once generate adds it)
    reading: SpanReading | None = None  # the span reader's, of the best sentence (once read)
    runners_up: tuple[str, ...] = ()    # the next best-scoring sentences' texts, best first (a second look reads them)


def _idf(sentences: Sequence[list[str]]) -> dict[str, float]:
    df: Counter[str] = Counter()
    for sentence_terms in sentences:
        df.update(set(sentence_terms))
    n = len(sentences)
    return {t: math.log(1 + n / (1 + c)) for t, c in df.items()}


def _coverage(question_terms: set[str], sentence_terms: set[str], idf: dict[str, float]) -> float:
    """IDF-weighted share of the question's terms the sentence holds (a question without terms
    covers nothing: the sum over the empty set is 0). The sums are exactly rounded (``math.fsum``),
    so they do not depend on the sets' iteration order, which changes with each process's hash
    seed: two sentences covering the same terms then tie exactly, and the tie is broken by rank
    and position rather than by the last bit of a float."""
    total = math.fsum(idf.get(t, math.log(1 + len(idf) + 1)) for t in question_terms)
    covered = math.fsum(idf.get(t, 0.0) for t in question_terms & sentence_terms)
    return covered / total if total else covered


NOTHING_FOUND = "I could not find anything about this in the documents."
NOT_IN_DOCUMENTS = ("The documents in this collection do not appear to answer this question. The closest passages "
                    "are given with this answer, in case the answer is phrased in a way I did not recognise.")
# The default abstention threshold on the answerability probability: the operating point the training
# chose (train_answerability.py; the model file records it, and a test keeps the two equal).
ABSTAIN_BELOW = 0.105


@dataclass(frozen=True)
class ExtractiveParameters:
    """What a version of the ``answer_extractive`` prompt can set: how many sentences an answer
    takes (the best, and others scoring at least ``support_ratio`` times as well), and the
    answerability probability below which it says the documents do not answer (0: never)."""

    max_sentences: int = MAX_SENTENCES
    support_ratio: float = SUPPORT_RATIO
    abstain_below: float = ABSTAIN_BELOW

    def __post_init__(self) -> None:
        if self.max_sentences < 1 or not 0 <= self.support_ratio <= 1 or not 0 <= self.abstain_below <= 1:
            raise ValueError("max_sentences must be >= 1, support_ratio and abstain_below in [0, 1]")

    def updated(self, parameters: dict[str, Any]) -> ExtractiveParameters:
        """These parameters with a prompt version's (those it sets win)."""
        known = {k: parameters[k] for k in ("max_sentences", "support_ratio", "abstain_below") if k in parameters}
        return replace(self, **known)


class ExtractiveGenerator:
    name = "extractive"

    prompt_name = PROMPT_NAME

    def __init__(self, abstain_below: float = ABSTAIN_BELOW, token_encoder: TokenEncoder | None = None,
                 parser: SyntaxParser | None = None, reader: SpanReader | None = None) -> None:
        """``abstain_below``: answer only when the answerability model's probability that the
        evidence answers reaches it (0 never abstains); a prompt version may set its own.
        ``token_encoder``: the local encoder whose token vectors align the question with the best
        passage near the threshold (without one, or once it fails, the default models decide).
        ``parser``: parses the question and the best sentence for the short answer, which the model
        that reads the parse then picks (without one, the model that does not); not needed with a
        reader. ``reader``: reads the best sentence for whether it answers and for the
        short answer (without one, or once it fails, the models that do without it decide)."""
        self.defaults = ExtractiveParameters(abstain_below=abstain_below)
        self._token_encoder = token_encoder
        self._parser = parser
        self._reader = reader

    @property
    def abstain_below(self) -> float:
        return self.defaults.abstain_below

    async def generate(self, question: str, sub_questions: Sequence[str], context: Sequence[Candidate], *,
                       tier: Complexity = "simple", injection_flagged: bool = False,
                       retrieval_confidence: float | None = None, on_token: TokenSink | None = None,
                       prompt: PromptVersion | None = None) -> GeneratedAnswer:
        """The AnswerGenerator protocol: what ``extract`` does, with ``prompt``'s parameters, and
        with the second look (the token alignment and the runner-up's read) where the default
        models are near the threshold or below it (``extract`` is synchronous and never takes
        it); each claim is passed to ``on_token`` as the answer's text (there is no model tier,
        and retrieved text is never executed as instructions)."""
        parameters = self.defaults.updated(prompt.parameters) if prompt is not None else self.defaults
        selection, assessment = await self.assessed(question, sub_questions, context, parameters)
        parsed = (await self._parse_async(question, selection.best)
                  if self._wants_parse(selection, assessment, parameters) else None)
        answer = self.answer(question, context, selection, parameters, assessment, parsed)
        answer = answer.model_copy(update={"prompt_name": PROMPT_NAME,
                                           "prompt_version": prompt.version if prompt is not None else None})
        if on_token is not None and not answer.claims:
            await on_token(answer.answer)
        elif on_token is not None:
            for claim in answer.claims:
                await on_token(claim.text + "".join(f" [{n}]" for n in claim.citations) + " ")
        return answer

    async def assessed(self, question: str, sub_questions: Sequence[str], context: Sequence[Candidate],
                       parameters: ExtractiveParameters | None = None) -> tuple[Selection | None, Assessment | None]:
        """The best evidence in ``context`` and the answerability models' reading of it (None, None
        when there is none), the second look deciding near the threshold and below it."""
        parameters = parameters or self.defaults
        selection = self.select(question, sub_questions, context, parameters=parameters)
        if selection is None:
            return None, None
        if self._reader is not None and (read := reader_input(selection, sub_questions)) is not None:
            try:
                selection = with_reading(selection, await self._reader.read_async(*read))
            except ProviderError as exc:
                self._reader_failed(exc)
        assessment = assess(selection.evidence)
        # Near the threshold and below it, a second look decides (one encoder call and a read);
        # elsewhere it would almost never change the decision.
        if self._token_encoder is not None and undecided(assessment.probability, parameters.abstain_below):
            # The encoder call and the read overlap: each alone leaves part of the two cores idle.
            evidence, gap_top = await asyncio.gather(self.aligned(selection.evidence),
                                                     self.best_gap(selection, sub_questions))
            # The aligned models were trained with the alignment on every example: without it (the
            # encoder failed) the default models decide, as they do from then on.
            if evidence.alignment is not None:
                selection = replace(selection, evidence=replace(evidence, reader_gap_top=gap_top))
                assessment = assess(selection.evidence)
        return selection, assessment

    async def best_gap(self, selection: Selection, sub_questions: Sequence[str]) -> float | None:
        """The reader's best gap over the selection's best sentence and its runners-up (each read
        alone, as the best sentence is, so it reads the same wherever it ranks; one that cannot be
        read is left out); None when the reader did not read the best sentence."""
        reader, best = self._reader, selection.evidence.reader_gap
        if reader is None or best is None or reader_input(selection, sub_questions) is None:
            return None
        gaps = [best]
        for sentence in selection.runners_up:
            try:
                gaps.append((await reader.read_async(selection.evidence.question, sentence, len(sentence))).gap)
            except ProviderError as exc:
                self._reader_failed(exc)
                if isinstance(exc, ReaderUnavailableError):
                    break
        return max(gaps)

    async def aligned(self, evidence: Evidence) -> Evidence:
        """``evidence`` with the question's token alignment to the best passage, when a local
        encoder is at hand (one encoder call of two short texts)."""
        if self._token_encoder is None:
            return evidence
        found = passage(evidence.best_chunk, evidence.best_sentence)
        try:
            asked, matched = await self._token_encoder.token_vectors([evidence.question, found])
        except ProviderError as exc:
            # The default models then decide, as without an encoder; a broken encoder is not
            # asked again by this generator (each try could mean a failing quantisation).
            log.error("token alignment off for this process: %s", exc)
            self._token_encoder = None
            return evidence
        return replace(evidence, alignment=alignment(evidence.question, asked, matched, evidence.idf))

    def _read(self, selection: Selection | None, sub_questions: Sequence[str]) -> Selection | None:
        """``selection`` read by the span reader, synchronously (``assessed`` reads off the event loop)."""
        if self._reader is None or selection is None or (read := reader_input(selection, sub_questions)) is None:
            return selection
        try:
            return with_reading(selection, self._reader.read(*read))
        except ProviderError as exc:
            self._reader_failed(exc)
            return selection

    def _reader_failed(self, exc: ProviderError) -> None:
        # This answer is judged without the reader's gap (it reads as unknown). A reader that cannot
        # run at all is not asked again by this generator (a graph that did not load will not
        # load); one that could not read this input is asked again for the next.
        if not isinstance(exc, ReaderUnavailableError):
            log.warning("span reader skipped for this answer: %s", exc)
            return
        if self._reader is not None:
            log.error("span reader off for this pipeline: %s", exc)
        self._reader = None

    def _wants_parse(self, selection: Selection | None, assessment: Assessment | None,
                     parameters: ExtractiveParameters) -> bool:
        """Whether to parse for the short answer: a parser is at hand, the reader has not read the
        passage (its span is the short answer then), and the answer will be given."""
        return (self._parser is not None and selection is not None and selection.reading is None
                and assessment is not None and assessment.probability >= parameters.abstain_below)

    def _parse(self, question: str, sentence: str) -> ShortAnswerParse | None:
        """The question and the sentence parsed for the short answer (the sentence alone at the
        entities depth: parse_for_short_answer); None for a clause question,
        and when the parser fails: then the model that does not read the parse picks it, and the
        parser is not asked again by this generator (a model that did not load will not load)."""
        parser = self._parser
        if parser is None:
            return None
        try:
            return parse_for_short_answer(question, sentence, parser)
        except ProviderError as exc:
            self._parser_failed(exc)
            return None

    async def _parse_async(self, question: str, sentence: str) -> ShortAnswerParse | None:
        """``_parse`` on the parser's own thread (about 12 ms of CPU on these 2 cores for the full
        parse, 5 ms for the entities)."""
        parser = self._parser
        if parser is None:
            return None
        try:
            return await parse_for_short_answer_async(question, sentence, parser)
        except ProviderError as exc:
            self._parser_failed(exc)
            return None

    def _parser_failed(self, exc: ProviderError) -> None:
        if self._parser is not None:
            log.error("short answers without the parse for this process: %s", exc)
        self._parser = None

    def select(self, question: str, sub_questions: Sequence[str], context: Sequence[Candidate],
               parameters: ExtractiveParameters | None = None) -> Selection | None:
        """The sentences that answer best (each part's best; for a single question, up to
        MAX_SENTENCES that score nearly as well) and the evidence the answerability models read;
        None when the context holds no sentence."""
        pool: list[_Scored] = []
        sentence_terms: list[list[str]] = []
        # Lines that head the text after them: no sentence-final punctuation, and more of the chunk
        # follows (a lone line, such as a one-line document, is content). Those that repeat the
        # document's title are never answers; the others only when they add a term to the question's.
        headings: set[int] = set()
        titles: set[int] = set()
        for number, candidate in enumerate(context, start=1):
            title = (candidate.hit.title or "").strip().casefold()
            sentences = split_sentences(candidate.hit.text)
            for position, sentence in enumerate(sentences):
                if position < len(sentences) - 1 and not sentence.text.endswith((".", "!", "?")):
                    headings.add(len(pool))
                    if sentence.text.casefold() == title:
                        titles.add(len(pool))
                pool.append(_Scored(number, sentence, 0.0))
                sentence_terms.append(terms(sentence.text))
        if not pool:
            return None
        parameters = parameters or self.defaults
        idf = _idf(sentence_terms)
        chosen: dict[tuple[int, int], _Scored] = {}
        evidence: Evidence | None = None
        runners_up: list[str] = []
        for index, q in enumerate([question, *sub_questions]):
            q_terms = set(terms(q))
            # A heading that repeats the title, or says nothing the question does not, covers the
            # question's words without answering it ("Super Bowl 50" above a paragraph): headings
            # compete only when the context holds nothing else. (Sentences are not held to this:
            # "Paris is the capital of France." answers "Is Paris the capital of France?".)
            informative = [(p, t) for i, (p, t) in enumerate(zip(pool, sentence_terms, strict=True))
                           if i not in titles and not (i in headings and set(t) <= q_terms)]
            scored = sorted(
                (_Scored(p.context, p.sentence, _coverage(q_terms, set(t), idf) + _RANK_PRIOR / p.context)
                 for p, t in informative or zip(pool, sentence_terms, strict=True)),
                key=lambda s: (-s.score, s.context, s.sentence.start),
            )
            top = scored[0]
            chosen.setdefault((top.context, top.sentence.start), top)
            if index == 0:
                # Whether the evidence answers is judged on the whole question's best sentence.
                document = context[top.context - 1].hit.document_id
                other = next((s for s in scored if context[s.context - 1].hit.document_id != document), None)
                evidence = Evidence(
                    question=question, best_sentence=top.sentence.text, best_chunk=context[top.context - 1].hit.text,
                    best_coverage=top.score - _RANK_PRIOR / top.context,
                    other_coverage=other.score - _RANK_PRIOR / other.context if other else 0.0,
                    context=[c.hit.text for c in context], idf=idf,
                    cosines=[c.scores["semantic"] for c in context if "semantic" in c.scores],
                    rerank_scores=[c.rerank_score for c in context if c.rerank_score is not None],
                    keyword_scores=[c.scores["keyword"] for c in context if "keyword" in c.scores])
                for s in scored[1:]:
                    if len(runners_up) == SECOND_LOOK_SENTENCES - 1:
                        break
                    if s.sentence.text != top.sentence.text and s.sentence.text not in runners_up:
                        runners_up.append(s.sentence.text)
                if not sub_questions:
                    # A single question may take a couple of supporting sentences that score nearly as well.
                    for s in scored[1:parameters.max_sentences]:
                        if s.score >= parameters.support_ratio * top.score:
                            chosen.setdefault((s.context, s.sentence.start), s)
        assert evidence is not None
        # Reading order: by context rank, then position in the chunk.
        ordered = sorted(chosen.values(), key=lambda s: (s.context, s.sentence.start))
        return Selection(ordered, max(chosen.values(), key=lambda s: s.score).sentence.text, evidence,
                         runners_up=tuple(runners_up))

    def extract(self, question: str, sub_questions: Sequence[str], context: Sequence[Candidate],
                retrieval_confidence: float | None = None,
                parameters: ExtractiveParameters | None = None) -> GeneratedAnswer:
        """The answer, or, when the answerability model finds the evidence does not answer the
        question, a statement saying so with the closest passages (``answered`` false).
        ``retrieval_confidence`` is accepted for the protocol's sake: the model reads the evidence
        itself. Synchronous, so without the token alignment (``generate`` adds it)."""
        parameters = parameters or self.defaults
        selection = self._read(self.select(question, sub_questions, context, parameters=parameters), sub_questions)
        assessment = assess(selection.evidence) if selection is not None else None
        parsed = self._parse(question, selection.best) if self._wants_parse(selection, assessment, parameters) else None
        return self.answer(question, context, selection, parameters, assessment, parsed)

    def answer(self, question: str, context: Sequence[Candidate], selection: Selection | None,
               parameters: ExtractiveParameters, assessment: Assessment | None = None,
               parsed: ShortAnswerParse | None = None) -> GeneratedAnswer:
        """The answer for a selection, judged by ``assessment`` (default: the answerability models'
        reading of its evidence); ``parsed``: the question and the best sentence parsed for the
        short answer (the question None at the entities depth; without it, the model that does not
        read the parse picks it)."""
        if selection is None:
            return GeneratedAnswer(answer=NOTHING_FOUND, citations=[], claims=[], confidence=0.0,
                                   generator="extractive", answered=False)
        assessment = assessment or assess(selection.evidence)
        if assessment.probability < parameters.abstain_below:
            # The confidence model knows answerable questions only; here the answerability
            # probability is the honest figure.
            return GeneratedAnswer(answer=NOT_IN_DOCUMENTS, citations=[], claims=[],
                                   confidence=round(assessment.probability, 3), generator="extractive",
                                   answered=False, answerability=shown(assessment),
                                   closest_sources=closest_sources(context))
        ordered = selection.sentences
        answer = " ".join(f"{s.sentence.text} [{s.context}]" for s in ordered)
        citations = []
        for s in ordered:
            if any(c.n == s.context for c in citations):
                continue
            hit = context[s.context - 1].hit
            citations.append(Citation(
                n=s.context, chunk_id=hit.chunk_id, document_id=hit.document_id, source_uri=hit.source_uri,
                title=hit.title, start_char=hit.start_char + s.sentence.start, end_char=hit.start_char + s.sentence.end,
                quote=s.sentence.text, verified=True,
            ))
        # Citation order follows the answer: the first citation is the first context cited.
        claims = verify_claims(answer, [c.hit.text for c in context], cited={c.n for c in citations})
        short = (reader_short_answer(question, selection.reading) if selection.reading is not None
                 else short_answer(question, selection.best, assessment.probability, parsed=parsed))
        return GeneratedAnswer(answer=answer, short_answer=short, citations=citations, claims=claims,
                               confidence=round(assessment.confidence, 3), generator="extractive",
                               answerability=shown(assessment))


def reader_input(selection: Selection, sub_questions: Sequence[str]) -> tuple[str, str, int] | None:
    """What the span reader reads of a selection: the question, the best sentence, and where the
    span may start (anywhere in it). The reader was trained on the sentence and the next one, but
    reading the sentence alone measured the same abstention and about 3 points fewer short answers
    on XQuAD, for about 3 ms less of p95 (docs/benchmarks.md). None (the models then read its gap as
    unknown) for what it was not trained to read: a question in parts (one span cannot answer them
    all), and a statement or keywords, which it reads as "no answer" (SciFact's claims on their own
    abstracts were answered 69% of the time read, 88% not; docs/benchmarks.md)."""
    if sub_questions or not is_question(selection.evidence.question):
        return None
    evidence = selection.evidence
    return evidence.question, evidence.best_sentence, len(evidence.best_sentence)


def with_reading(selection: Selection, reading: SpanReading) -> Selection:
    """``selection`` with the span reader's reading of its best sentence."""
    return replace(selection, reading=reading, evidence=replace(selection.evidence, reader_gap=reading.gap))
