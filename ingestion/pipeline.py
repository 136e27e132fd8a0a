"""The ingestion pipeline: sources → documents → chunks → embeddings → one transaction per batch.

Three stages run concurrently and hand over through bounded queues:

1. *prepare* (worker thread): load files, extract metadata, hash; look up stored versions;
   chunk only new or changed documents; collect the stored vectors of unchanged chunks;
2. *embed*: one model call per batch for the chunks whose text is new;
3. *write*: replace the batch's documents and chunks in one transaction.

A batch is all-or-nothing in the database, so a crash leaves every document at its old or its
new version; re-running the same ingest skips what was committed (same content hash), which is
what makes a killed job resumable.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from ingestion.chunking import ChunkDraft, Chunker, chunk_hash
from ingestion.loaders import Format, LoadedDocument, LoadError, Source, holds_many_documents, load_file, walk
from ingestion.metadata import extract_metadata
from rag_service.db.repos import DocumentCatalog
from rag_service.domain import ChunkRecord, DocumentRecord, DocumentState
from rag_service.providers.embeddings import Embedder
from rag_service.stores.base import VectorStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class IngestOptions:
    collection: str
    format: Format = "auto"
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    prune: bool = False
    tags: tuple[str, ...] = ()
    lob: str | None = None
    acl: tuple[str, ...] = ()
    max_file_bytes: int = 50 * 1024 * 1024
    batch_documents: int = 64


@dataclass
class IngestReport:
    files: int = 0
    added: int = 0
    updated: int = 0
    unchanged: int = 0
    deleted: int = 0
    failed: int = 0
    chunks_embedded: int = 0
    chunks_reused: int = 0
    errors: list[dict[str, str]] = field(default_factory=list)
    seconds: float = 0.0
    # Sources that could not be read: their stored documents must survive --prune.
    unreadable: set[str] = field(default_factory=set)

    def as_dict(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "documents": {"added": self.added, "updated": self.updated, "unchanged": self.unchanged,
                          "deleted": self.deleted, "failed": self.failed},
            "chunks": {"embedded": self.chunks_embedded, "reused": self.chunks_reused},
            "errors": self.errors,
            "seconds": round(self.seconds, 3),
        }


@dataclass(frozen=True)
class Progress:
    """Emitted after each batch is written (and once at the start with the file count)."""

    files_total: int
    files_done: int
    documents_done: int
    chunks_embedded: int
    chunks_reused: int
    elapsed_s: float


@dataclass
class _Prepared:
    """A document ready to be written: its record, its chunk drafts, and which need embedding."""

    record: DocumentRecord
    drafts: list[ChunkDraft]
    reused: dict[str, np.ndarray]
    is_new: bool


@dataclass
class _Batch:
    items: list[_Prepared]
    files_done: int
    texts_to_embed: list[str] = field(default_factory=list)
    vectors: np.ndarray | None = None


def document_hash(doc: LoadedDocument, options: IngestOptions, chunker_signature: str) -> str:
    """Changes when anything that ends up stored changes; file mtime alone does not count."""
    payload = {
        "text": doc.text, "title": doc.title, "metadata": doc.metadata,
        "tags": sorted(set(doc.tags) | set(options.tags)),
        "lob": doc.lob or options.lob, "acl": sorted(options.acl), "chunker": chunker_signature,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def chunk_id(document_id: uuid.UUID, draft: ChunkDraft) -> uuid.UUID:
    """Deterministic, so re-running an interrupted ingest writes the same rows."""
    return uuid.uuid5(document_id, f"{draft.ordinal}:{draft.content_hash}")


class Ingestor:
    def __init__(self, store: VectorStore, catalog: DocumentCatalog, embedder: Embedder, chunker: Chunker,
                 chunker_signature: str) -> None:
        self._store = store
        self._catalog = catalog
        self._embedder = embedder
        self._chunker = chunker
        self._signature = chunker_signature

    # --- entry points ----------------------------------------------------------------------

    async def ingest_paths(
        self, paths: Sequence[Path], options: IngestOptions, progress: Callable[[Progress], None] | None = None
    ) -> IngestReport:
        sources = await asyncio.to_thread(walk, paths, options.include, options.exclude)
        return await self._run(len(sources), options, progress,
                               lambda report: self._iter_sources(sources, options, report))

    async def ingest_documents(
        self, documents: Sequence[LoadedDocument], options: IngestOptions,
        progress: Callable[[Progress], None] | None = None,
    ) -> IngestReport:
        """Ingest already-loaded documents (API uploads); each counts as one file."""
        return await self._run(len(documents), options, progress,
                               lambda report: ((doc, i + 1) for i, doc in enumerate(documents)))

    # --- the three stages ------------------------------------------------------------------

    async def _run(self, files: int, options: IngestOptions, progress: Callable[[Progress], None] | None,
                   docs: Callable[[IngestReport], Iterator[tuple[LoadedDocument, int]]]) -> IngestReport:
        report = IngestReport(files=files)
        started = time.perf_counter()
        seen: set[str] = set()
        to_embed: asyncio.Queue[_Batch | None] = asyncio.Queue(maxsize=2)
        to_write: asyncio.Queue[_Batch | None] = asyncio.Queue(maxsize=2)
        if progress:
            progress(Progress(files, 0, 0, 0, 0, 0.0))

        async def prepare() -> None:
            try:
                async for batch in self._prepare(docs(report), options, report, seen):
                    await to_embed.put(batch)
            finally:
                await to_embed.put(None)

        async def embed() -> None:
            try:
                while (batch := await to_embed.get()) is not None:
                    if batch.texts_to_embed:
                        batch.vectors = await self._embedder.embed(batch.texts_to_embed)
                    await to_write.put(batch)
            finally:
                await to_write.put(None)

        async def write() -> None:
            documents_done = 0
            while (batch := await to_write.get()) is not None:
                await self._write(batch, report)
                documents_done += len(batch.items)
                if progress:
                    progress(Progress(files, batch.files_done, documents_done + report.unchanged,
                                      report.chunks_embedded, report.chunks_reused, time.perf_counter() - started))

        tasks = [asyncio.create_task(stage()) for stage in (prepare, embed, write)]
        try:
            await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        if options.prune:
            if "*" in report.unreadable:
                report.errors.append({"source": "--prune", "error": "skipped: a corpus file could not be read "
                                      "whole, so which documents are gone is unknown"})
            else:
                deleted = await self._catalog.delete_missing(options.collection, seen | report.unreadable)
                report.deleted = len(deleted)
        report.seconds = time.perf_counter() - started
        if progress:
            progress(Progress(files, files, len(seen), report.chunks_embedded, report.chunks_reused,
                              report.seconds))
        return report

    async def _prepare(self, docs: Iterator[tuple[LoadedDocument, int]], options: IngestOptions,
                       report: IngestReport, seen: set[str]) -> AsyncIterator[_Batch]:
        while True:
            # One thread hop per batch: reading and parsing files stay off the event loop.
            group = await asyncio.to_thread(lambda: list(itertools.islice(docs, options.batch_documents)))
            if not group:
                return
            batch = await self._prepare_group(group, options, report, seen)
            if batch.items or batch.files_done:
                yield batch
            if len(group) < options.batch_documents:
                return

    async def _prepare_group(self, group: list[tuple[LoadedDocument, int]], options: IngestOptions,
                             report: IngestReport, seen: set[str]) -> _Batch:
        hashed = []
        for doc, _ in group:
            if doc.source_uri in seen:
                # A second document under the same URI in one run would overwrite the first and,
                # in one batch, break it: the first one wins and the repeat is reported.
                report.failed += 1
                report.errors.append({"source": doc.source_uri,
                                      "error": "the same source URI appears twice in this ingest; kept the first"})
                continue
            seen.add(doc.source_uri)
            hashed.append((doc, document_hash(doc, options, self._signature)))
        states = await self._catalog.states(options.collection, [doc.source_uri for doc, _ in hashed])
        changed = []
        for doc, digest in hashed:
            state = states.get(doc.source_uri)
            if state is not None and state.content_hash == digest:
                report.unchanged += 1
            else:
                changed.append((doc, digest, state))
        reusable = await self._catalog.vectors_by_hash([s.id for _, _, s in changed if s is not None])
        drafts = await asyncio.to_thread(lambda: [self._chunker.chunk(doc) for doc, _, _ in changed])
        batch = _Batch(items=[], files_done=group[-1][1])
        pending: set[str] = set()
        for (doc, digest, state), doc_drafts in zip(changed, drafts, strict=True):
            if not any(d.embed for d in doc_drafts):
                report.failed += 1
                report.errors.append({"source": doc.source_uri, "error": "the document produced no text to index"})
                continue
            record = self._record(doc, digest, state, options)
            reused = {}
            for draft in doc_drafts:
                if not draft.embed:
                    continue
                if draft.content_hash in reusable:
                    reused[draft.content_hash] = reusable[draft.content_hash]
                elif draft.content_hash not in pending:
                    pending.add(draft.content_hash)
                    batch.texts_to_embed.append(draft.text)
            batch.items.append(_Prepared(record, doc_drafts, reused, is_new=state is None))
        return batch

    def _record(self, doc: LoadedDocument, digest: str, state: DocumentState | None,
                options: IngestOptions) -> DocumentRecord:
        extracted = extract_metadata(doc.text)
        metadata = {**extracted, **doc.metadata, "kind": doc.kind}
        if doc.modified_at:
            metadata["modified_at"] = doc.modified_at.isoformat()
        effective = extracted.get("effective_date")
        return DocumentRecord(
            id=state.id if state else uuid.uuid4(),
            collection=options.collection, source_uri=doc.source_uri, title=doc.title or _first_line(doc.text),
            content_hash=digest, version=state.version + 1 if state else 1, metadata=metadata,
            acl=options.acl, lob=doc.lob or options.lob, tags=tuple(dict.fromkeys((*options.tags, *doc.tags))),
            effective_date=(datetime.fromisoformat(str(effective)).replace(tzinfo=UTC) if effective
                            else doc.modified_at),
        )

    async def _write(self, batch: _Batch, report: IngestReport) -> None:
        fresh: dict[str, np.ndarray] = {}
        if batch.vectors is not None:
            texts = batch.texts_to_embed
            fresh = {chunk_hash(text): vector for text, vector in zip(texts, batch.vectors, strict=True)}
        items = []
        embedded = reused = 0
        for prepared in batch.items:
            record = prepared.record
            ids = {d.ordinal: chunk_id(record.id, d) for d in prepared.drafts}
            chunks = []
            for draft in prepared.drafts:
                vector = None
                if draft.embed:
                    if draft.content_hash in prepared.reused:
                        vector = prepared.reused[draft.content_hash]
                        reused += 1
                    else:
                        vector = fresh[draft.content_hash]
                        embedded += 1
                chunks.append(ChunkRecord(
                    id=ids[draft.ordinal], document_id=record.id,
                    parent_id=ids[draft.parent_ordinal] if draft.parent_ordinal is not None else None,
                    ordinal=draft.ordinal, text=draft.text, start_char=draft.start_char, end_char=draft.end_char,
                    token_count=draft.token_count, content_hash=draft.content_hash, metadata=draft.metadata,
                    embedding=vector.tolist() if vector is not None else None,
                ))
            items.append((record, chunks))
        await self._store.replace_documents(items)
        # Counted only once committed: a crash before this line leaves no trace in the report.
        report.chunks_embedded += embedded
        report.chunks_reused += reused
        for prepared in batch.items:
            if prepared.is_new:
                report.added += 1
            else:
                report.updated += 1

    # --- sources -----------------------------------------------------------------------------

    def _iter_sources(self, sources: Iterable[Source], options: IngestOptions,
                      report: IngestReport) -> Iterator[tuple[LoadedDocument, int]]:
        """Runs in a worker thread: file reading and parsing stay off the event loop."""
        for number, source in enumerate(sources, start=1):
            # A corpus file holds many documents under other URIs: when it (or a row whose URI is
            # unknown) cannot be read, none of the collection's documents may be pruned.
            unreadable = "*" if holds_many_documents(source.path, options.format) else source.uri
            try:
                for item in load_file(source, options.format, max_bytes=options.max_file_bytes):
                    if isinstance(item, LoadError):
                        self._failed(report, str(source.path), item, "*")
                        continue
                    yield item, number
            except (LoadError, OSError, UnicodeDecodeError) as exc:
                self._failed(report, str(source.path), exc, unreadable)

    @staticmethod
    def _failed(report: IngestReport, source: str, error: Exception, unreadable: str) -> None:
        report.failed += 1
        report.errors.append({"source": source, "error": str(error)})
        report.unreadable.add(unreadable)


def _first_line(text: str) -> str | None:
    for line in text.splitlines():
        line = line.strip().lstrip("#").strip()
        if line:
            return line[:200]
    return None
