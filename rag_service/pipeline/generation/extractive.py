"""The extractive generator (no LLM): it answers with the retrieved sentences that best answer
the question (and each sub-question), in reading order, each cited [n], with a short answer span
when one is likely enough: the span reader's (read_answers.py), or without a reader the pattern
model's (spans.py); selection.py picks the sentences. When the answerability model
(answerability.py, which reads the span reader's "no answer" too; near its threshold and below it,
with a second look: the question's token alignment to the best passage, alignment.py, and the
reader on the runners-up) finds the retrieved evidence does not answer the question, it says so
instead and lists the closest passages. An answer's confidence comes from the calibrated
confidence model; a "does not answer" reports the answerability probability."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from rag_service.domain import Candidate, Citation, Complexity, GeneratedAnswer
from rag_service.domain.prompts import PromptVersion
from rag_service.errors import ProviderError
from rag_service.pipeline.generation.alignment import alignment, passage
from rag_service.pipeline.generation.answerability import Assessment, Evidence, assess, undecided
from rag_service.pipeline.generation.declines import closest_sources, shown
from rag_service.pipeline.generation.read_answers import reader_short_answer
from rag_service.pipeline.generation.selection import (
    Selection,
    reader_input,
    select_sentences,
    with_reading,
)
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

MAX_SENTENCES = 3
SUPPORT_RATIO = 0.6
PROMPT_NAME = "answer_extractive"

log = logging.getLogger(__name__)

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
        that reads the parse then picks (without one, the model that does not); not needed for what
        the reader read. ``reader``: reads the best sentence for whether it answers and for the
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
                                                     self.best_gap(selection))
            # The aligned models were trained with the alignment on every example: without it (the
            # encoder failed) the default models decide, as they do from then on.
            if evidence.alignment is not None:
                selection = replace(selection, evidence=replace(evidence, reader_gap_top=gap_top))
                assessment = assess(selection.evidence)
        return selection, assessment

    async def best_gap(self, selection: Selection) -> float | None:
        """The reader's best gap over the selection's best sentence and its runners-up (each read
        alone, as the best sentence is, so it reads the same wherever it ranks; one that cannot be
        read is left out); None when the reader did not read the best sentence (``assessed`` reads it
        only where ``reader_input`` lets it, so the runners-up are read under the same rule)."""
        reader, best = self._reader, selection.evidence.reader_gap
        if reader is None or best is None:
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
        """Whether to parse for the short answer: a parser is at hand, a question was asked (nothing
        else gets one: spans.short_answer), the reader has not read the passage (its span is the
        short answer then), and the answer will be given."""
        return (self._parser is not None and selection is not None and selection.reading is None
                and is_question(selection.evidence.question)
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
        """``selection.select_sentences`` with these parameters (the prompt version's, or the defaults)."""
        parameters = parameters or self.defaults
        return select_sentences(question, sub_questions, context, parameters.max_sentences, parameters.support_ratio)

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
        # Either way, keywords and statements get none: short answers are for questions.
        short = (reader_short_answer(question, selection.reading) if selection.reading is not None
                 else short_answer(question, selection.best, assessment.probability, parsed=parsed))
        return GeneratedAnswer(answer=answer, short_answer=short, citations=citations, claims=claims,
                               confidence=round(assessment.confidence, 3), generator="extractive",
                               answerability=shown(assessment))
