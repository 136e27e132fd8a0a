"""Ingestion jobs as the job repository stores them and the jobs API shows them."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from rag_service.domain.tenants import CollectionKey

JobStatus = Literal["queued", "running", "succeeded", "failed"]


@dataclass(frozen=True)
class Upload:
    """A file (or a document sent as text) kept with its job until the job has run."""

    source_uri: str
    filename: str
    content: bytes
    title: str | None = None
    metadata: dict[str, Any] | None = None


class JobView(BaseModel):
    id: uuid.UUID
    collection: CollectionKey
    status: JobStatus = Field(description="queued | running | succeeded | failed")
    params: dict[str, Any]
    progress: dict[str, Any]
    report: dict[str, Any] | None = Field(description="Counts and per-file errors once finished.")
    error: str | None
    attempts: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
