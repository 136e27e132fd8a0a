"""When a user's rating queues an answer for review (pure).

Ratings are 1 to 5. A rating of 2 or less (``LOW_RATING``) queues the answer with source
``feedback``; the lowest rating, 1, at the high tier. A second rating of the same answer joins
the same item (``enqueue`` is idempotent per answer) and adds its reason.
"""

from __future__ import annotations

import textwrap

from rag_service.domain import ReviewTrigger
from rag_service.domain.review import LOW_RATING

COMMENT_IN_REASON_CHARS = 200


def feedback_trigger(rating: int, comment: str | None, *, overall: float | None = None,
                     held: bool = False) -> ReviewTrigger | None:
    """The queue entry a rating asks for, or None for a rating above ``LOW_RATING``."""
    if not 1 <= rating <= 5:
        raise ValueError(f"ratings are 1 to 5, got {rating}")
    if rating > LOW_RATING:
        return None
    reason = f"user feedback: rating {rating}/5"
    if comment and comment.strip():
        reason += ": " + textwrap.shorten(" ".join(comment.split()), COMMENT_IN_REASON_CHARS, placeholder="...")
    return ReviewTrigger(source="feedback", tier="high" if rating == 1 else "normal", reasons=(reason,),
                         overall=overall, held=held)
