"""What a declined answer shows (pure): the closest passages for the user to look at, the
answerability models' reading, and the check of an LLM's "the passages do not contain the answer"
against those models (the extractive generator's own abstention shows the same)."""

from __future__ import annotations

from collections.abc import Sequence

from rag_service.domain import Candidate, Citation, GeneratedAnswer
from rag_service.pipeline.generation.answerability import Assessment
from rag_service.text.sentences import split_sentences


def confirm_decline(answer: GeneratedAnswer, assessment: Assessment | None, abstain_below: float) -> GeneratedAnswer:
    """An LLM's "the passages do not contain the answer" (a reply citing nothing), checked by the
    answerability models that decide the extractive abstention. Where they read the evidence the same
    way (or there is none), it stands, reported as an extractive abstention is: with their
    probability as its confidence and no short answer. Where they read the evidence as answering, the
    reply is taken as an answer that cites nothing, so it is graded (and queued for review) as such
    answers always were: a reply that answers without citing must not pass as an abstention,
    ungraded. The price: these models abstain on about 78% of questions whose paragraph is missing
    (docs/benchmarks.md), so an honest decline is overruled, and reviewed, in the other cases."""
    if answer.answered:
        return answer
    if assessment is None:
        return answer.model_copy(update={"short_answer": None})
    if assessment.probability < abstain_below:
        return answer.model_copy(update={"confidence": round(assessment.probability, 3), "short_answer": None,
                                         "answerability": shown(assessment)})
    return answer.model_copy(update={"answered": True, "closest_sources": [], "answerability": shown(assessment)})


def shown(assessment: Assessment) -> dict[str, float]:
    """What the result shows of the model's reading: its probability and the features it read."""
    return {"probability": round(assessment.probability, 4), **assessment.features}


def closest_sources(context: Sequence[Candidate], limit: int = 3) -> list[Citation]:
    """The first ``limit`` retrieved passages, shown with a "the documents do not answer" for the
    user to look at, not as support."""
    return [_closest(n, c) for n, c in enumerate(context[:limit], start=1)]


def _closest(n: int, candidate: Candidate) -> Citation:
    """A retrieved passage shown for the user to look at, not as support (``verified`` false)."""
    hit = candidate.hit
    first = split_sentences(hit.text)[:1]
    start = first[0].start if first else 0
    quote = first[0].text if first else hit.text[:300]
    return Citation(n=n, chunk_id=hit.chunk_id, document_id=hit.document_id, source_uri=hit.source_uri,
                    title=hit.title, start_char=hit.start_char + start, end_char=hit.start_char + start + len(quote),
                    quote=quote, verified=False)
