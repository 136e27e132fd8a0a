"""Documents and ingestion jobs: upload (202 + job), list, get with chunks, delete; job status."""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response, status
from fastapi.responses import JSONResponse
from procrastinate import App
from pydantic import BaseModel, Field

from ingestion.jobs import enqueue, options_to_params
from ingestion.pipeline import IngestOptions
from rag_service.api.auth import IngesterDep, ReaderDep, check_readable, role, scoped_collection
from rag_service.api.deps import RuntimeDep
from rag_service.api.uploads import MULTIPART_SCHEMA, DocumentCreate, UploadBatch, read_upload_request
from rag_service.db.repos.answers import forget_documents
from rag_service.domain import COLLECTION_PATTERN, Caller, DocumentSummary, JobView, StoredChunk
from rag_service.errors import ForbiddenError, NotFoundError, OverloadedError
from rag_service.runtime import Runtime

router = APIRouter(prefix="/v1", tags=["documents"])

BODY_MODELS = [DocumentCreate]


class JobAccepted(BaseModel):
    job_id: uuid.UUID
    status: str
    status_url: str


# The public schemas are the domain's, under the API's names (no field is copied by hand).
class JobPublic(JobView):
    """An ingestion job: its progress and outcome. Its parameters stay private (a queued job's
    holds paths on the server)."""

    params: dict[str, Any] = Field(default_factory=dict, exclude=True)


class JobsPublic(BaseModel):
    data: list[JobPublic]
    count: int


class DocumentPublic(DocumentSummary):
    """A stored document."""


class DocumentsPublic(BaseModel):
    data: list[DocumentPublic]
    count: int


class ChunkPublic(StoredChunk):
    """A chunk of a document, with its offsets in the document's text."""


class DocumentWithChunks(DocumentPublic):
    chunks: list[ChunkPublic]


@router.post(
    "/documents",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=JobAccepted,
    summary="Ingest documents (files or text) in the background",
    description="Send `multipart/form-data` with one or more `files`, or JSON: one `DocumentCreate` object "
                "or a list of them. Answers 202 with a job id; poll `status_url` for progress and the outcome. "
                "A file that cannot be read fails inside the job (see its report); the rest are ingested.",
    **role("ingester", openapi_extra={"requestBody": {"required": True, "content": {
        "multipart/form-data": {"schema": MULTIPART_SCHEMA},
        "application/json": {"schema": {"oneOf": [
            {"$ref": "#/components/schemas/DocumentCreate"},
            {"type": "array", "items": {"$ref": "#/components/schemas/DocumentCreate"}},
        ]}},
    }}}),
    responses={413: {"description": "A file, the number of files or the request is over its limit"},
               422: {"description": "Malformed request"},
               503: {"description": "Too many ingestion jobs are waiting (RAGSVC_MAX_QUEUED_JOBS; see Retry-After), "
                                    "or the database is down or cannot write its files (read-only); nothing stored"},
               507: {"description": "The database's disk is full; nothing stored"}},
)
async def create_documents(request: Request, runtime: RuntimeDep, caller: IngesterDep) -> JSONResponse:
    settings = runtime.settings
    batch = await read_upload_request(request, settings.ingest_max_file_bytes, max_files=settings.ingest_max_files,
                                      max_request_bytes=settings.ingest_max_request_bytes)
    accepted = await queue_ingestion(runtime, request.app.state.queue, caller, batch)
    return JSONResponse(accepted.model_dump(mode="json"), status_code=202, headers={"Location": accepted.status_url})


async def queue_ingestion(runtime: Runtime, queue: App, caller: Caller, batch: UploadBatch) -> JobAccepted:
    """Store an ingestion job with its uploads and queue it, once the caller's key may write the
    collection (POST /v1/documents; the MCP tool ``ingest_text``)."""
    collection = scoped_collection(caller, batch.collection)
    if (queued := await runtime.jobs.count_queued()) >= runtime.settings.max_queued_jobs:
        raise OverloadedError(f"{queued:,} ingestion jobs are waiting already (RAGSVC_MAX_QUEUED_JOBS "
                              f"{runtime.settings.max_queued_jobs:,}); retry later, or add workers", retry_after_s=30)
    options = IngestOptions(collection=collection, tags=tuple(batch.tags), lob=batch.lob,
                            acl=tuple(batch.acl), max_file_bytes=runtime.settings.ingest_max_file_bytes,
                            batch_documents=runtime.settings.ingest_batch_documents)
    job_id = await runtime.jobs.create(collection, options_to_params(options), batch.uploads)
    await enqueue(queue, job_id, runtime.jobs)
    return JobAccepted(job_id=job_id, status="queued", status_url=f"/v1/jobs/{job_id}")


@router.get("/jobs/{job_id}", response_model=JobPublic, summary="Status, progress and outcome of a job",
            responses={404: {"description": "No such job"}}, **role("reader"))
async def get_job(job_id: uuid.UUID, runtime: RuntimeDep, caller: ReaderDep) -> JobPublic:
    job = await runtime.jobs.get(job_id)
    check_readable(caller, job.collection, (), f"job {job_id}")
    return JobPublic.model_validate(job, from_attributes=True)


@router.get("/jobs", response_model=JobsPublic, summary="Ingestion jobs, newest first", **role("reader"))
async def list_jobs(runtime: RuntimeDep, caller: ReaderDep, limit: Annotated[int, Query(ge=1, le=500)] = 50,
                    offset: Annotated[int, Query(ge=0)] = 0) -> JobsPublic:
    jobs, total = await runtime.jobs.list(limit=limit, offset=offset, scope=caller.scope)
    return JobsPublic(data=[JobPublic.model_validate(j, from_attributes=True) for j in jobs], count=total)


@router.get("/documents", response_model=DocumentsPublic, summary="Documents, most recently updated first",
            **role("reader"))
async def list_documents(
    runtime: RuntimeDep,
    caller: ReaderDep,
    collection: Annotated[str | None, Query(pattern=COLLECTION_PATTERN)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> DocumentsPublic:
    if collection is None and caller.collections is not None:  # a key limited to collections lists one at a time
        if len(caller.collections) > 1:
            raise ForbiddenError(f"this key may only use the collections {', '.join(caller.collections)}; "
                                 "name one with ?collection=")
        collection = caller.collections[0]
    return await readable_documents(runtime, caller, collection, limit=limit, offset=offset)


async def readable_documents(runtime: Runtime, caller: Caller, collection: str | None, *, limit: int,
                             offset: int) -> DocumentsPublic:
    """A page of the documents the caller may read, in one collection or (None) in all of its
    tenant's (GET /v1/documents; the MCP resource of a collection's documents)."""
    key = scoped_collection(caller, collection) if collection is not None else None
    documents, total = await runtime.catalog.list(key, limit=limit, offset=offset, principals=caller.principals,
                                                  scope=caller.scope)
    return DocumentsPublic(data=[DocumentPublic.model_validate(d, from_attributes=True) for d in documents],
                           count=total)


@router.get("/documents/{document_id}", response_model=DocumentWithChunks, summary="A document and its chunks",
            responses={404: {"description": "No such document"}}, **role("reader"))
async def get_document(document_id: uuid.UUID, runtime: RuntimeDep, caller: ReaderDep) -> DocumentWithChunks:
    return await readable_document(runtime, caller, document_id)


async def readable_document(runtime: Runtime, caller: Caller, document_id: uuid.UUID) -> DocumentWithChunks:
    """A document and its chunks, as the caller's key may see it (GET /v1/documents/{id}; the MCP
    document resource)."""
    found = await runtime.catalog.get(document_id)
    if found is None:
        raise NotFoundError(f"no document {document_id}")
    document, chunks = found
    check_readable(caller, document.collection, document.acl, f"document {document_id}")
    return DocumentWithChunks(**document.model_dump(),
                              chunks=[ChunkPublic.model_validate(c, from_attributes=True) for c in chunks])


@router.delete("/documents/{document_id}", status_code=204, summary="Delete a document and its chunks",
               description="Its chunks and keyword index entries go with it. Logged answers (and reviewers' golden "
                           "items) that cite it stay readable: in the same transaction their citations of it are "
                           "marked `deleted` and lose their quotes, and stored traces mark its passages `deleted`.",
               responses={404: {"description": "No such document"}}, **role("ingester"))
async def delete_document(document_id: uuid.UUID, runtime: RuntimeDep, caller: IngesterDep) -> Response:
    if not caller.local:  # a key deletes only what it may read
        found = await runtime.catalog.get(document_id)
        if found is not None:
            check_readable(caller, found[0].collection, found[0].acl, f"document {document_id}")
    if not await runtime.store.delete_document(document_id, before_delete=forget_documents):
        raise NotFoundError(f"no document {document_id}")
    return Response(status_code=204)
