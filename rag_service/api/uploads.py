"""Reading an ingestion request's body: multipart files, or JSON documents. What comes out is the
job's options and its uploads; what cannot be used is a 413/422 that says what to fix."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from fastapi import Request
from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from rag_service.domain import COLLECTION_PATTERN, Upload
from rag_service.errors import InvalidInputError, PayloadTooLargeError


class DocumentCreate(BaseModel):
    """One document given as text."""

    source_uri: str = Field(min_length=1, max_length=2000, description="Unique within the collection; "
                            "sending the same source_uri again updates the document.")
    text: str = Field(min_length=1, description="The document text (Markdown when source_uri ends in .md).")
    title: str | None = Field(default=None, max_length=1000)
    metadata: dict[str, Any] = Field(default_factory=dict)
    collection: str = Field(default="default", pattern=COLLECTION_PATTERN)
    tags: list[str] = Field(default_factory=list, max_length=100)
    lob: str | None = Field(default=None, max_length=200)
    acl: list[str] = Field(default_factory=list, max_length=100, description="Principals allowed to read; "
                           "empty = everyone.")


MULTIPART_SCHEMA = {
    "type": "object",
    "required": ["files"],
    "properties": {
        "files": {"type": "array", "items": {"type": "string", "format": "binary"},
                  "description": ".txt .md .html .pdf .docx; the file name is the document's source_uri"},
        "collection": {"type": "string", "default": "default"},
        "tags": {"type": "string", "description": "comma-separated"},
        "lob": {"type": "string"},
        "acl": {"type": "string", "description": "comma-separated principals"},
    },
}
_DOCUMENTS = TypeAdapter(DocumentCreate | list[DocumentCreate])


@dataclass(frozen=True)
class UploadBatch:
    collection: str
    tags: list[str]
    lob: str | None
    acl: list[str]
    uploads: list[Upload]


async def read_upload_request(request: Request, limit: int, *, max_files: int = 1000,
                              max_request_bytes: int | None = None) -> UploadBatch:
    """The batch a POST /v1/documents carries: each file or text at most ``limit`` bytes, at most
    ``max_files`` of them, the whole body at most ``max_request_bytes`` (checked on its
    Content-Length, before anything is read)."""
    declared = request.headers.get("content-length", "")
    if max_request_bytes is not None and declared.isdigit() and int(declared) > max_request_bytes:
        raise PayloadTooLargeError(f"the request body is {int(declared):,} bytes, over the {max_request_bytes:,}-byte "
                                   "limit (RAGSVC_INGEST_MAX_REQUEST_BYTES); split the upload into several requests")
    content_type = request.headers.get("content-type", "")
    if content_type.startswith("multipart/form-data"):
        batch = await _read_multipart(request, limit)
    elif content_type.startswith("application/json"):
        batch = _read_json(await request.body(), limit)
    else:
        raise InvalidInputError("send multipart/form-data with 'files', or application/json documents")
    if len(batch.uploads) > max_files:
        raise PayloadTooLargeError(f"{len(batch.uploads):,} documents in one request, over the {max_files:,} limit "
                                   "(RAGSVC_INGEST_MAX_FILES); split the upload into several requests")
    uris = [u.source_uri for u in batch.uploads]
    repeated = sorted({uri for uri in uris if uris.count(uri) > 1})
    if repeated:
        raise InvalidInputError(f"each document needs its own source_uri (file name); repeated: {repeated[:5]}")
    return batch


def _split_list(value: object) -> list[str]:
    return [part.strip() for part in str(value or "").split(",") if part.strip()]


async def _read_multipart(request: Request, limit: int) -> UploadBatch:
    form = await request.form()
    files = [f for f in form.getlist("files") + form.getlist("file") if not isinstance(f, str)]
    if not files:
        raise InvalidInputError("send at least one file in the multipart field 'files'")
    collection = str(form.get("collection") or "default")
    if not re.match(COLLECTION_PATTERN, collection):
        raise InvalidInputError(f"collection {collection!r} must be 1-200 letters, digits, '_', '-' or '.'")
    uploads = []
    for upload in files:
        name = PurePosixPath(upload.filename or "").name
        if not name:
            raise InvalidInputError("every file needs a file name (it becomes the document's source_uri)")
        content = await upload.read(limit + 1)
        if len(content) > limit:
            raise PayloadTooLargeError(f"{name} is over the {limit:,}-byte limit (RAGSVC_INGEST_MAX_FILE_BYTES)")
        uploads.append(Upload(source_uri=name, filename=name, content=content))
    lob = form.get("lob")
    return UploadBatch(collection, _split_list(form.get("tags")), str(lob) if lob else None,
                       _split_list(form.get("acl")), uploads)


def _read_json(body: bytes, limit: int) -> UploadBatch:
    try:
        parsed = _DOCUMENTS.validate_json(body)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors()[:10])
        raise InvalidInputError(f"invalid document JSON: {problems}") from None
    return batch_of(parsed if isinstance(parsed, list) else [parsed], limit)


def batch_of(documents: list[DocumentCreate], limit: int) -> UploadBatch:
    """Documents given as text (a JSON body, the MCP tool ``ingest_text``) as one job's batch."""
    if not documents:
        raise InvalidInputError("send at least one document")
    first = documents[0]
    if any((d.collection, d.tags, d.lob, d.acl) != (first.collection, first.tags, first.lob, first.acl)
           for d in documents):
        raise InvalidInputError("documents of one request must share collection, tags, lob and acl")
    uploads = []
    for doc in documents:
        content = doc.text.encode("utf-8")
        if len(content) > limit:
            raise PayloadTooLargeError(f"{doc.source_uri} is over the {limit:,}-byte limit")
        # Text sent as JSON is parsed as Markdown or plain text, whatever else its name suggests.
        markdown = PurePosixPath(doc.source_uri).suffix.lower() in (".md", ".markdown")
        filename = "inline.md" if markdown else "inline.txt"
        uploads.append(Upload(source_uri=doc.source_uri, filename=filename, content=content, title=doc.title,
                              metadata=doc.metadata))
    return UploadBatch(first.collection, first.tags, first.lob, first.acl, uploads)
