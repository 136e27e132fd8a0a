"""What the monitoring endpoint reads from the database when scraped."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class QueueFigures:
    jobs_by_status: Mapping[str, int]  # ingestion jobs (queued: the queue's depth)
    reviews_by_status: Mapping[str, int]
    open_review_age_s: Mapping[str, float | None]  # "p50", "p95" of the open review items' age
