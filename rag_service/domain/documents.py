"""Documents and chunks as they cross the store boundary: records written, hits read, the filter
every search applies, and the catalog's views of what is stored."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rag_service.domain.tenants import CollectionKey

JsonScalar = str | int | float | bool | None
# Collection names as the API and CLI accept them.
COLLECTION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,199}$"


class DocumentRecord(BaseModel):
    """One source document in a collection. ``source_uri`` is unique within the collection."""

    model_config = ConfigDict(frozen=True)

    id: uuid.UUID = Field(default_factory=uuid.uuid4)
    collection: CollectionKey = Field(min_length=1, max_length=264)
    source_uri: str = Field(min_length=1, max_length=2000)
    title: str | None = None
    content_hash: str = Field(min_length=1, max_length=128)
    version: int = Field(default=1, ge=1)
    metadata: dict[str, Any] = Field(default_factory=dict)
    acl: tuple[str, ...] = Field(default=(), description="Principals allowed to read; empty = everyone.")
    lob: str | None = Field(default=None, description="Line of business.")
    tags: tuple[str, ...] = ()
    effective_date: datetime | None = None

    @field_validator("acl")
    @classmethod
    def _principals_are_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for principal in value:
            if not principal.strip() or principal == "*":
                raise ValueError(f"ACL principal {principal!r} must be a non-empty name other than '*'")
        return value


class ChunkRecord(BaseModel):
    """A piece of a document with its embedding. Offsets are character offsets into the document text."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    id: uuid.UUID = Field(default_factory=uuid.uuid4)
    document_id: uuid.UUID
    parent_id: uuid.UUID | None = None
    ordinal: int = Field(ge=0)
    text: str = Field(min_length=1)
    start_char: int = Field(ge=0)
    end_char: int = Field(ge=0)
    token_count: int = Field(ge=0)
    content_hash: str = Field(min_length=1, max_length=128)
    metadata: dict[str, Any] = Field(default_factory=dict)
    embedding: list[float] | None = Field(default=None, description="None for parent chunks, which are not searched.")

    @model_validator(mode="after")
    def _offsets_in_order(self) -> ChunkRecord:
        if self.end_char < self.start_char:
            raise ValueError(f"end_char ({self.end_char}) must not be before start_char ({self.start_char})")
        return self


class MetadataRange(BaseModel):
    """Inclusive/exclusive bounds on one metadata key; numbers and ISO dates compare as such."""

    model_config = ConfigDict(frozen=True)

    gte: float | str | None = None
    gt: float | str | None = None
    lte: float | str | None = None
    lt: float | str | None = None

    @model_validator(mode="after")
    def _at_least_one_bound(self) -> MetadataRange:
        bounds = [self.gte, self.gt, self.lte, self.lt]
        if all(b is None for b in bounds):
            raise ValueError("a range needs at least one of gte, gt, lte, lt")
        kinds = {isinstance(b, str) for b in bounds if b is not None}
        if len(kinds) > 1:
            raise ValueError("a range must compare numbers with numbers or strings/dates with strings/dates")
        return self


class SearchFilter(BaseModel):
    """Scoping that every search strategy applies inside SQL.

    ``principals`` are the caller's: a chunk is visible when its document has no ACL or shares a
    principal with the caller. ``acl_bypass`` is for trusted internal callers (admin tools) only.
    """

    model_config = ConfigDict(frozen=True)

    collection: str | None = None
    metadata_equals: dict[str, JsonScalar] = Field(default_factory=dict)
    metadata_in: dict[str, list[JsonScalar]] = Field(default_factory=dict)
    metadata_range: dict[str, MetadataRange] = Field(default_factory=dict)
    date_from: datetime | None = None
    date_to: datetime | None = None
    lob: str | None = None
    tags_any: tuple[str, ...] = ()
    principals: tuple[str, ...] = ()
    acl_bypass: bool = False

    @field_validator("metadata_equals", "metadata_in", "metadata_range")
    @classmethod
    def _keys_are_sane(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in value:
            if not key or len(key) > 200:
                raise ValueError(f"metadata key {key!r} must be 1-200 characters")
        return value

    @field_validator("metadata_in")
    @classmethod
    def _in_lists_not_empty(cls, value: dict[str, list[JsonScalar]]) -> dict[str, list[JsonScalar]]:
        for key, options in value.items():
            if not options:
                raise ValueError(f"metadata_in[{key!r}] needs at least one value")
        return value

    @model_validator(mode="after")
    def _dates_in_order(self) -> SearchFilter:
        if self.date_from and self.date_to and self.date_from > self.date_to:
            raise ValueError("date_from must not be after date_to")
        return self


class SearchHit(BaseModel):
    """One chunk returned by a store search, with the document fields a citation needs."""

    chunk_id: uuid.UUID
    document_id: uuid.UUID
    parent_id: uuid.UUID | None
    ordinal: int
    source_uri: str
    title: str | None
    text: str
    start_char: int
    end_char: int
    score: float
    metadata: dict[str, Any] = Field(default_factory=dict)
    document_date: datetime | None = Field(default=None, description="The document's effective date, else when "
                                                                     "it was last updated (for freshness).")


class DocumentState(BaseModel):
    """What ingestion needs to know of a stored document to decide whether to re-process it."""

    model_config = ConfigDict(frozen=True)

    id: uuid.UUID
    content_hash: str
    version: int


class DocumentSummary(BaseModel):
    """A stored document as the catalog (and the documents API) shows it."""

    id: uuid.UUID
    collection: CollectionKey
    source_uri: str
    title: str | None
    version: int
    content_hash: str
    metadata: dict[str, Any]
    acl: list[str] = Field(description="Principals allowed to read; empty = everyone.")
    lob: str | None
    tags: list[str]
    effective_date: datetime | None
    created_at: datetime
    updated_at: datetime
    chunk_count: int


class StoredChunk(BaseModel):
    id: uuid.UUID
    parent_id: uuid.UUID | None
    ordinal: int
    text: str
    start_char: int
    end_char: int
    token_count: int
    metadata: dict[str, Any]
    embedded: bool = Field(description="False for parent chunks, which are not searched themselves.")


class CollectionSummary(BaseModel):
    """A collection as listings show it to a caller."""

    name: CollectionKey
    description: str | None
    documents: int = Field(description="Documents in it the caller may read.")
    created_at: datetime


class StoreCounts(BaseModel):
    collections: int
    documents: int
    chunks: int
    embedded_chunks: int
