"""What the caller of ``GET /v1/answers/{id}`` sees (pure): a delivered answer as generated; a
held one (review gate in hold mode) only once a reviewer has decided, and then as reviewed."""

from __future__ import annotations

from rag_service.db.repos.answers import AnswerRecord
from rag_service.domain.review import AnswerView

REJECTED_ANSWER = ("This question cannot be answered reliably from the documents: a reviewer rejected the "
                   "generated answer.")


def answer_view(record: AnswerRecord) -> AnswerView:
    base = {"answer_id": record.answer_id, "collection": record.collection, "question": record.question,
            "review_id": record.review_id, "review_status": record.review_status, "created_at": record.created_at}
    if not record.held:
        return AnswerView(status="answered", answer=record.text, short_answer=record.short_answer,
                          citations=record.citations, scores=record.scores, **base)
    if record.decision == "approved":
        return AnswerView(status="reviewed", answer=record.text, short_answer=record.short_answer,
                          citations=record.citations, scores=record.scores,
                          message="approved by a reviewer", **base)
    if record.decision == "edited":
        # The stored scores graded the generated answer, not the correction: not shown with it.
        return AnswerView(status="reviewed", answer=record.corrected_answer, citations=record.citations,
                          message="corrected by a reviewer", **base)
    if record.decision == "rejected":
        return AnswerView(status="rejected", answer=REJECTED_ANSWER, message="a reviewer rejected the answer",
                          **base)
    if record.review_status == "expired":
        return AnswerView(status="expired", answer=None,
                          message="held for review, and no reviewer decided in time; the answer is withheld", **base)
    return AnswerView(status="pending_review", answer=None,
                      message=f"held until a reviewer decides; ask again later (GET /v1/answers/{record.answer_id})",
                      **base)
