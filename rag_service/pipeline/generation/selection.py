"""Which retrieved sentences answer a question (pure): each sentence scored by the IDF-weighted
share of the question's terms it holds (weights from the retrieved sentences themselves), with a
small prior for the chunk's rank; the best one per question or part, for a single question up to a
few more that score nearly as well, and for a second look the runners-up. Also the evidence the
answerability models read of the selection, and what the span reader reads of it. The extractive
generator (extractive.py) turns a selection into an answer."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

from rag_service.domain import Candidate, SpanReading
from rag_service.pipeline.generation.answerability import Evidence
from rag_service.text.questions import is_statement
from rag_service.text.sentences import Sentence, split_sentences
from rag_service.text.terms import terms

# A second look reads this many of the best-scoring sentences (the best, read already, and its
# runners-up): out of fold on XQuAD, 2 to 5 did about as well (docs/benchmarks.md), and each read
# costs about 5 ms; three runners-up put the answers that take the second look past the p95.
SECOND_LOOK_SENTENCES = 2
RANK_PRIOR = 0.15


@dataclass(frozen=True)
class Scored:
    context: int           # 1-based context number
    sentence: Sentence
    score: float


@dataclass(frozen=True)
class Selection:
    sentences: list[Scored]   # in reading order
    best: str                 # the best-scoring sentence's text (where a short answer is looked for)
    evidence: Evidence        # what the answerability models read (the alignment only once generate adds it)
    reading: SpanReading | None = None  # the span reader's, of the best sentence (once read)
    runners_up: tuple[str, ...] = ()    # the next best-scoring sentences' texts, best first (a second look reads them)


def idf_weights(sentences: Sequence[list[str]]) -> dict[str, float]:
    df: Counter[str] = Counter()
    for sentence_terms in sentences:
        df.update(set(sentence_terms))
    n = len(sentences)
    return {t: math.log(1 + n / (1 + c)) for t, c in df.items()}


def coverage(question_terms: set[str], sentence_terms: set[str], idf: dict[str, float]) -> float:
    """IDF-weighted share of the question's terms the sentence holds (a question without terms
    covers nothing: the sum over the empty set is 0). The sums are exactly rounded (``math.fsum``),
    so they do not depend on the sets' iteration order, which changes with each process's hash
    seed: two sentences covering the same terms then tie exactly, and the tie is broken by rank
    and position rather than by the last bit of a float."""
    total = math.fsum(idf.get(t, math.log(1 + len(idf) + 1)) for t in question_terms)
    covered = math.fsum(idf.get(t, 0.0) for t in question_terms & sentence_terms)
    return covered / total if total else covered


def select_sentences(question: str, sub_questions: Sequence[str], context: Sequence[Candidate],
                     max_sentences: int, support_ratio: float) -> Selection | None:
    """The sentences that answer best (each part's best; for a single question, up to
    ``max_sentences`` that score at least ``support_ratio`` times as well) and the evidence the
    answerability models read; None when the context holds no sentence."""
    pool: list[Scored] = []
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
            pool.append(Scored(number, sentence, 0.0))
            sentence_terms.append(terms(sentence.text))
    if not pool:
        return None
    idf = idf_weights(sentence_terms)
    chosen: dict[tuple[int, int], Scored] = {}
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
            (Scored(p.context, p.sentence, coverage(q_terms, set(t), idf) + RANK_PRIOR / p.context)
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
                best_coverage=top.score - RANK_PRIOR / top.context,
                other_coverage=other.score - RANK_PRIOR / other.context if other else 0.0,
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
                for s in scored[1:max_sentences]:
                    if s.score >= support_ratio * top.score:
                        chosen.setdefault((s.context, s.sentence.start), s)
    assert evidence is not None
    # Reading order: by context rank, then position in the chunk.
    ordered = sorted(chosen.values(), key=lambda s: (s.context, s.sentence.start))
    return Selection(ordered, max(chosen.values(), key=lambda s: s.score).sentence.text, evidence,
                     runners_up=tuple(runners_up))


def reader_input(selection: Selection, sub_questions: Sequence[str]) -> tuple[str, str, int] | None:
    """What the span reader reads of a selection: the question, the best sentence, and where the
    span may start (anywhere in it). The reader was trained on the sentence and the next one, but
    reading the sentence alone measured the same abstention and about 3 points fewer short answers
    on XQuAD, for about 3 ms less of p95 (docs/benchmarks.md). None (the models then read its gap as
    unknown) for what it was not trained to read: a question in parts (one span cannot answer them
    all), and a statement, which it reads as "no answer" (SciFact's claims on their own abstracts
    were answered 69% of the time read, 88% not). Keywords are read: a search for "warsaw
    population" asks for a fact as a question does, and XQuAD's questions typed as keywords
    abstained without their paragraph 0.83 read, 0.77 not, answering a point less often with it
    (0.93 against 0.94; docs/benchmarks.md, "Abstention beyond XQuAD's questions")."""
    if sub_questions or is_statement(selection.evidence.question):
        return None
    evidence = selection.evidence
    return evidence.question, evidence.best_sentence, len(evidence.best_sentence)


def with_reading(selection: Selection, reading: SpanReading) -> Selection:
    """``selection`` with the span reader's reading of its best sentence."""
    return replace(selection, reading=reading, evidence=replace(selection.evidence, reader_gap=reading.gap))
