"""The extractive generator (no LLM): it answers with the retrieved sentences that best answer
the question (and each sub-question), in reading order, each cited [n]; and, when the question
asks for a number, a date, a person or a place, the span of that kind nearest the question's
words in the best sentence, as the short answer."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from rag_service.domain import Candidate, Citation, Complexity, GeneratedAnswer
from rag_service.pipeline.generation.tokens import TokenSink
from rag_service.text.citations import verify_claims
from rag_service.text.sentences import Sentence, split_sentences
from rag_service.text.terms import terms

MAX_SENTENCES = 3
_RANK_PRIOR = 0.15

_NUMBER = (r"(?:\$|€|£)?\d[\d,]*(?:\.\d+)?(?:\s?(?:%|percent|million|billion|thousand|hundred))?"
           r"(?:\s(?:seconds?|minutes?|hours?|days?|weeks?|months?|years?|km|kilometers?|kilometres?|miles?|"
           r"meters?|metres?|feet|kg|pounds?))?")
_YEAR = r"\b(?:1[5-9]|20)\d{2}\b"
_MONTH = r"(?:January|February|March|April|May|June|July|August|September|October|November|December)"
_DATE = (rf"(?:{_MONTH}\s+\d{{1,2}}(?:st|nd|rd|th)?,?\s+\d{{4}}|\d{{1,2}}\s+{_MONTH}\s+\d{{4}}"
         rf"|{_MONTH}\s+\d{{4}}|{_YEAR})")
_NAME = r"(?:[A-Z][\w'.-]*(?:\s+(?:of|de|von|van|the|and)?\s*[A-Z][\w'.-]*)*)"
_SPAN_KINDS: list[tuple[re.Pattern[str], re.Pattern[str]]] = [
    (re.compile(r"\b(how (many|much|long|far|old|big|large)|what (percentage|proportion|number|amount)|"
                r"how much)\b", re.I), re.compile(_NUMBER)),
    (re.compile(r"\b(when|what (year|date|day|month|decade|century)|which year)\b", re.I), re.compile(_DATE)),
    (re.compile(r"\b(who|whom|whose|which (person|company|team|organi[sz]ation|group))\b", re.I),
     re.compile(_NAME)),
    (re.compile(r"\b(where|which (city|country|state|place|region))\b", re.I), re.compile(_NAME)),
]


@dataclass(frozen=True)
class _Scored:
    context: int           # 1-based context number
    sentence: Sentence
    score: float


def _idf(sentences: Sequence[list[str]]) -> dict[str, float]:
    df: Counter[str] = Counter()
    for sentence_terms in sentences:
        df.update(set(sentence_terms))
    n = len(sentences)
    return {t: math.log(1 + n / (1 + c)) for t, c in df.items()}


def _coverage(question_terms: set[str], sentence_terms: set[str], idf: dict[str, float]) -> float:
    """IDF-weighted share of the question's terms the sentence holds (a question without terms
    covers nothing: the sum over the empty set is 0)."""
    total = sum(idf.get(t, math.log(1 + len(idf) + 1)) for t in question_terms)
    covered = sum(idf.get(t, 0.0) for t in question_terms & sentence_terms)
    return covered / total if total else covered


def short_answer(question: str, sentence: str) -> str | None:
    """The span answering a how-many / when / who / where question, from ``sentence``: of the
    right kind, not already in the question, nearest to the question's words."""
    for asks, kind in _SPAN_KINDS:
        if not asks.search(question):
            continue
        question_lower = question.lower()
        anchors = [m.start() for t in set(terms(question)) for m in re.finditer(re.escape(t), sentence.lower())]
        candidates = [m for m in kind.finditer(sentence)
                      if m.group(0).strip(" ,.") and m.group(0).lower() not in question_lower]
        if not candidates:
            return None
        best = candidates[0] if not anchors else min(
            candidates, key=lambda m: min(abs(m.start() - a) for a in anchors))
        span = re.sub(r"^(The|A|An)\s+", "", best.group(0).strip(" ,."))
        # "How many minutes...?" is answered by the number: the question already names the unit.
        unit = re.search(r"\s([a-z]+)$", span)
        if unit and re.search(rf"\b{unit.group(1)}", question_lower):
            span = span[: unit.start()]
        return span
    return None


class ExtractiveGenerator:
    name = "extractive"

    async def generate(self, question: str, sub_questions: Sequence[str], context: Sequence[Candidate], *,
                       tier: Complexity = "simple", injection_flagged: bool = False,
                       retrieval_confidence: float | None = None, on_token: TokenSink | None = None) -> GeneratedAnswer:
        """The AnswerGenerator protocol: ``extract``, with each claim passed to ``on_token`` as the
        answer's text (there is no model tier, and retrieved text is never executed as instructions)."""
        answer = self.extract(question, sub_questions, context, retrieval_confidence)
        if on_token is not None:
            for claim in answer.claims:
                await on_token(claim.text + "".join(f" [{n}]" for n in claim.citations) + " ")
        return answer

    def extract(self, question: str, sub_questions: Sequence[str], context: Sequence[Candidate],
                retrieval_confidence: float | None = None) -> GeneratedAnswer:
        pool: list[_Scored] = []
        sentence_terms: list[list[str]] = []
        for number, candidate in enumerate(context, start=1):
            for sentence in split_sentences(candidate.hit.text):
                pool.append(_Scored(number, sentence, 0.0))
                sentence_terms.append(terms(sentence.text))
        if not pool:
            return GeneratedAnswer(answer="I could not find anything about this in the documents.", citations=[],
                                   claims=[], confidence=0.0, generator="extractive")
        idf = _idf(sentence_terms)
        chosen: dict[tuple[int, int], _Scored] = {}
        best_overall = 0.0
        for index, q in enumerate([question, *sub_questions]):
            q_terms = set(terms(q))
            scored = sorted(
                (_Scored(p.context, p.sentence, _coverage(q_terms, set(t), idf) + _RANK_PRIOR / p.context)
                 for p, t in zip(pool, sentence_terms, strict=True)),
                key=lambda s: (-s.score, s.context, s.sentence.start),
            )
            top = scored[0]
            best_overall = max(best_overall, top.score - _RANK_PRIOR / top.context)
            chosen.setdefault((top.context, top.sentence.start), top)
            if index == 0 and not sub_questions:
                # A single question may take a couple of supporting sentences that score nearly as well.
                for s in scored[1:MAX_SENTENCES]:
                    if s.score >= 0.6 * top.score:
                        chosen.setdefault((s.context, s.sentence.start), s)
        # Reading order: by context rank, then position in the chunk.
        ordered = sorted(chosen.values(), key=lambda s: (s.context, s.sentence.start))
        best = max(chosen.values(), key=lambda s: s.score)
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
        claims = verify_claims(answer, [c.hit.text for c in context])
        # How well the best sentence covers the question, tempered by the retrieval's own confidence
        # when it could judge its results.
        confidence = best_overall if retrieval_confidence is None else 0.7 * best_overall + 0.3 * retrieval_confidence
        confidence = max(0.0, min(1.0, confidence))
        return GeneratedAnswer(answer=answer, short_answer=short_answer(question, best.sentence.text),
                               citations=citations, claims=claims, confidence=round(confidence, 3),
                               generator="extractive")
