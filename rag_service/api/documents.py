"""Documents and ingestion jobs: upload (202 + job), list, get with chunks, delete; job status."""

from __future__ import annotations

import uuid
from datetime import datetime
from pathlib import PurePosixPath
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response, status
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from rag_service.api.deps import RuntimeDep
from rag_service.domain import COLLECTION_PATTERN
from rag_service.errors import InvalidInputError, NotFoundError, RagServiceError

router = APIRouter(prefix="/v1", tags=["documents"])


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


BODY_MODELS = [DocumentCreate]


class JobAccepted(BaseModel):
    job_id: uuid.UUID
    status: str
    status_url: str


class JobPublic(BaseModel):
    id: uuid.UUID
    collection: str
    status: str = Field(description="queued | running | succeeded | failed")
    progress: dict[str, Any]
    report: dict[str, Any] | None = Field(description="Counts and per-file errors once finished.")
    error: str | None
    attempts: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class JobsPublic(BaseModel):
    data: list[JobPublic]
    count: int


class DocumentPublic(BaseModel):
    id: uuid.UUID
    collection: str
    source_uri: str
    title: str | None
    version: int
    content_hash: str
    metadata: dict[str, Any]
    acl: list[str]
    lob: str | None
    tags: list[str]
    effective_date: datetime | None
    created_at: datetime
    updated_at: datetime
    chunk_count: int


class DocumentsPublic(BaseModel):
    data: list[DocumentPublic]
    count: int


class ChunkPublic(BaseModel):
    id: uuid.UUID
    parent_id: uuid.UUID | None
    ordinal: int
    text: str
    start_char: int
    end_char: int
    token_count: int
    metadata: dict[str, Any]
    embedded: bool


class DocumentWithChunks(DocumentPublic):
    chunks: list[ChunkPublic]


_MULTIPART_SCHEMA = {
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


@router.post(
    "/documents",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=JobAccepted,
    summary="Ingest documents (files or text) in the background",
    description="Send `multipart/form-data` with one or more `files`, or JSON: one `DocumentCreate` object "
                "or a list of them. Answers 202 with a job id; poll `status_url` for progress and the outcome. "
                "A file that cannot be read fails inside the job (see its report); the rest are ingested.",
    openapi_extra={"requestBody": {"required": True, "content": {
        "multipart/form-data": {"schema": _MULTIPART_SCHEMA},
        "application/json": {"schema": {"oneOf": [
            {"$ref": "#/components/schemas/DocumentCreate"},
            {"type": "array", "items": {"$ref": "#/components/schemas/DocumentCreate"}},
        ]}},
    }}},
    responses={413: {"description": "A file is over the size limit"}, 422: {"description": "Malformed request"}},
)
async def create_documents(request: Request, runtime: RuntimeDep) -> JSONResponse:
    from ingestion.jobs import JobRepository, enqueue, options_to_params
    from ingestion.pipeline import IngestOptions

    content_type = request.headers.get("content-type", "")
    limit = runtime.settings.ingest_max_file_bytes
    if content_type.startswith("multipart/form-data"):
        collection, tags, lob, acl, uploads = await _read_multipart(request, limit)
    elif content_type.startswith("application/json"):
        collection, tags, lob, acl, uploads = await _read_json(request, limit)
    else:
        raise InvalidInputError("send multipart/form-data with 'files', or application/json documents")
    options = IngestOptions(collection=collection, tags=tuple(tags), lob=lob, acl=tuple(acl),
                            max_file_bytes=limit, batch_documents=runtime.settings.ingest_batch_documents)
    uris = [u.source_uri for u in uploads]
    repeated = sorted({uri for uri in uris if uris.count(uri) > 1})
    if repeated:
        raise InvalidInputError(f"each document needs its own source_uri (file name); repeated: {repeated[:5]}")
    jobs = JobRepository(runtime.db)
    job_id = await jobs.create(collection, options_to_params(options), uploads)
    await enqueue(request.app.state.queue, job_id, jobs)
    url = f"/v1/jobs/{job_id}"
    body = JobAccepted(job_id=job_id, status="queued", status_url=url)
    return JSONResponse(body.model_dump(mode="json"), status_code=202, headers={"Location": url})


class PayloadTooLargeError(RagServiceError):
    status_code = 413
    title = "payload too large"


def _split_list(value: object) -> list[str]:
    return [part.strip() for part in str(value or "").split(",") if part.strip()]


async def _read_multipart(request: Request, limit: int) -> tuple[str, list[str], str | None, list[str], list]:
    from ingestion.jobs import Upload

    form = await request.form()
    files = [f for f in form.getlist("files") + form.getlist("file") if hasattr(f, "read")]
    if not files:
        raise InvalidInputError("send at least one file in the multipart field 'files'")
    collection = str(form.get("collection") or "default")
    _check_collection(collection)
    uploads = []
    for upload in files:
        name = PurePosixPath(upload.filename or "").name
        if not name:
            raise InvalidInputError("every file needs a file name (it becomes the document's source_uri)")
        content = await upload.read(limit + 1)
        if len(content) > limit:
            raise PayloadTooLargeError(f"{name} is over the {limit:,}-byte limit (RAGSVC_INGEST_MAX_FILE_BYTES)")
        uploads.append(Upload(source_uri=name, filename=name, content=content))
    return collection, _split_list(form.get("tags")), (str(form["lob"]) if form.get("lob") else None), \
        _split_list(form.get("acl")), uploads


_DOCUMENTS = TypeAdapter(DocumentCreate | list[DocumentCreate])


async def _read_json(request: Request, limit: int) -> tuple[str, list[str], str | None, list[str], list]:
    from ingestion.jobs import Upload

    try:
        parsed = _DOCUMENTS.validate_json(await request.body())
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors()[:10])
        raise InvalidInputError(f"invalid document JSON: {problems}") from None
    documents = parsed if isinstance(parsed, list) else [parsed]
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
    return first.collection, first.tags, first.lob, first.acl, uploads


def _check_collection(name: str) -> None:
    import re

    if not re.match(COLLECTION_PATTERN, name):
        raise InvalidInputError(f"collection {name!r} must be 1-200 letters, digits, '_', '-' or '.'")


@router.get("/jobs/{job_id}", response_model=JobPublic, summary="Status, progress and outcome of a job",
            responses={404: {"description": "No such job"}})
async def get_job(job_id: uuid.UUID, runtime: RuntimeDep) -> JobPublic:
    from ingestion.jobs import JobRepository

    return JobPublic(**(await JobRepository(runtime.db).get(job_id)).__dict__)


@router.get("/jobs", response_model=JobsPublic, summary="Ingestion jobs, newest first")
async def list_jobs(runtime: RuntimeDep, limit: Annotated[int, Query(ge=1, le=500)] = 50,
                    offset: Annotated[int, Query(ge=0)] = 0) -> JobsPublic:
    from ingestion.jobs import JobRepository

    jobs, total = await JobRepository(runtime.db).list(limit=limit, offset=offset)
    return JobsPublic(data=[JobPublic(**j.__dict__) for j in jobs], count=total)


@router.get("/documents", response_model=DocumentsPublic, summary="Documents, most recently updated first")
async def list_documents(
    runtime: RuntimeDep,
    collection: Annotated[str | None, Query(pattern=COLLECTION_PATTERN)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> DocumentsPublic:
    documents, total = await runtime.catalog.list(collection, limit=limit, offset=offset)
    return DocumentsPublic(data=[DocumentPublic(**d.__dict__) for d in documents], count=total)


@router.get("/documents/{document_id}", response_model=DocumentWithChunks, summary="A document and its chunks",
            responses={404: {"description": "No such document"}})
async def get_document(document_id: uuid.UUID, runtime: RuntimeDep) -> DocumentWithChunks:
    found = await runtime.catalog.get(document_id)
    if found is None:
        raise NotFoundError(f"no document {document_id}")
    document, chunks = found
    return DocumentWithChunks(**document.__dict__, chunks=[ChunkPublic(**c.__dict__) for c in chunks])


@router.delete("/documents/{document_id}", status_code=204, summary="Delete a document and its chunks",
               responses={404: {"description": "No such document"}})
async def delete_document(document_id: uuid.UUID, runtime: RuntimeDep) -> Response:
    if not await runtime.store.delete_document(document_id):
        raise NotFoundError(f"no document {document_id}")
    return Response(status_code=204)
