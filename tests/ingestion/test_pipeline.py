"""The ingestion pipeline end to end on a real PostgreSQL and the real local model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import text

from ingestion.pipeline import IngestOptions
from rag_service.config import load_settings
from rag_service.domain import SearchFilter
from rag_service.runtime import Runtime
from tests.ingestion.files import make_pdf

LONG_SECTION = " ".join(f"Paragraph sentence {i} explains replication slot number {i}." for i in range(60))


@pytest.fixture(scope="module")
async def runtime(migrated_url: str, local_embedder):
    rt = Runtime.open(load_settings(database_url=migrated_url, chunk_size=64, chunk_overlap=8))
    rt.embedder = local_embedder  # the session's already-loaded model
    yield rt
    await rt.close()


def _corpus(root: Path) -> Path:
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "guide.md").write_text(
        "---\ntags: [ops]\nlob: infra\n---\n# Guide\n\nIntro about pgvector.\n\n## Replication\n\n" + LONG_SECTION
        + "\n\n## Errors\n\nError E-4012 means the pool is exhausted. Updated 2025-02-03.\n")
    (root / "docs" / "notes.txt").write_text("Zebras are striped. Penguins cannot fly.")
    (root / "docs" / "manual.pdf").write_bytes(make_pdf(["Page one about widgets.", "Page two about gadgets."]))
    (root / "docs" / "broken.pdf").write_bytes(b"%PDF-1.4 this is not a pdf")
    (root / "docs" / "empty.txt").write_text("")
    return root / "docs"


async def _chunk_rows(rt: Runtime, collection: str) -> list[tuple]:
    async with rt.db.connect() as conn:
        return (await conn.execute(text(
            "SELECT d.source_uri, c.ordinal, c.content_hash, c.embedding::text, d.version FROM chunks c "
            "JOIN documents d ON d.id = c.document_id JOIN collections k ON k.id = d.collection_id "
            "WHERE k.name = :c ORDER BY 1, 2"), {"c": collection})).all()


async def test_ingest_then_reingest_incrementally(runtime: Runtime, tmp_path: Path) -> None:
    docs = _corpus(tmp_path)
    ingestor = runtime.ingestor()
    options = IngestOptions(collection="inc", batch_documents=2)
    events = []

    first = await ingestor.ingest_paths([docs], options, events.append)
    assert (first.added, first.updated, first.unchanged, first.failed) == (3, 0, 0, 2)
    assert {Path(e["source"]).name for e in first.errors} == {"broken.pdf", "empty.txt"}
    assert first.chunks_embedded > 5 and first.chunks_reused == 0
    assert events[-1].files_done == first.files == 5
    rows_before = await _chunk_rows(runtime, "inc")
    assert len(rows_before) == first.chunks_embedded

    again = await ingestor.ingest_paths([docs], options)
    assert (again.added, again.updated, again.unchanged, again.chunks_embedded) == (0, 0, 3, 0)
    assert await _chunk_rows(runtime, "inc") == rows_before

    # Edit one paragraph of the guide: only the chunks whose text changed are embedded.
    guide = docs / "guide.md"
    guide.write_text(guide.read_text().replace("Penguins", "x").replace("exhausted", "used up"))
    edited = await ingestor.ingest_paths([docs], options)
    assert (edited.updated, edited.unchanged) == (1, 2)
    guide_rows_before = [r for r in rows_before if r[0].endswith("guide.md")]
    assert 1 <= edited.chunks_embedded < len(guide_rows_before)
    assert edited.chunks_reused == len(guide_rows_before) - edited.chunks_embedded
    rows_after = await _chunk_rows(runtime, "inc")
    guide_after = [r for r in rows_after if r[0].endswith("guide.md")]
    assert {r[4] for r in guide_after} == {2}
    vectors_before = {r[2]: r[3] for r in guide_rows_before}
    for _, _, digest, vector, _ in guide_after:
        if digest in vectors_before:
            assert vector == vectors_before[digest], "a reused chunk keeps its stored vector"

    hits = await runtime.store.text_search("used up", SearchFilter(collection="inc"), 5)
    assert hits and hits[0].source_uri.endswith("guide.md")
    assert await runtime.store.text_search("exhausted", SearchFilter(collection="inc"), 5) == []


async def test_metadata_pages_and_headings_are_stored(runtime: Runtime, tmp_path: Path) -> None:
    docs = _corpus(tmp_path)
    await runtime.ingestor().ingest_paths([docs], IngestOptions(collection="meta", tags=("cli-tag",)))
    summaries, total = await runtime.catalog.list("meta")
    assert total == 3
    guide = next(s for s in summaries if s.source_uri.endswith("guide.md"))
    assert guide.tags == ["cli-tag", "ops"] and guide.lob == "infra"
    assert guide.metadata["identifiers"] == ["E-4012"]
    assert guide.metadata["effective_date"] == "2025-02-03"
    assert guide.effective_date.date().isoformat() == "2025-02-03"
    assert guide.title == "Guide" and guide.version == 1
    _, chunks = await runtime.catalog.get(guide.id)
    assert any(c.metadata.get("heading_path") == "Guide > Replication" for c in chunks)
    pdf = next(s for s in summaries if s.source_uri.endswith("manual.pdf"))
    _, pdf_chunks = await runtime.catalog.get(pdf.id)
    # Both short pages fit one chunk, which records where it starts and ends.
    assert [(c.metadata["page"], c.metadata.get("page_end")) for c in pdf_chunks] == [(1, 2)]


async def test_prune_deletes_documents_no_longer_present(runtime: Runtime, tmp_path: Path) -> None:
    docs = _corpus(tmp_path)
    ingestor = runtime.ingestor()
    await ingestor.ingest_paths([docs], IngestOptions(collection="prune"))
    (docs / "notes.txt").unlink()
    report = await ingestor.ingest_paths([docs], IngestOptions(collection="prune", prune=True))
    assert report.deleted == 1
    _, total = await runtime.catalog.list("prune")
    assert total == 2
    assert await runtime.store.text_search("zebras", SearchFilter(collection="prune"), 5) == []

    # A file that exists but cannot be read now keeps its stored document.
    (docs / "manual.pdf").write_bytes(b"%PDF-1.4 truncated")
    report = await ingestor.ingest_paths([docs], IngestOptions(collection="prune", prune=True))
    assert report.deleted == 0 and report.failed == 3
    _, total = await runtime.catalog.list("prune")
    assert total == 2


async def test_beir_corpus_uses_ids_as_source_uris(runtime: Runtime, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(json.dumps(r) for r in [
        {"_id": "4983", "title": "Microstructural development", "text": "Alterations of the architecture."},
        {"_id": "5836", "title": "Induction of myelodysplasia", "text": "Myelodysplastic syndromes are."},
        {"bad": "row"},
    ]))
    report = await runtime.ingestor().ingest_paths([corpus], IngestOptions(collection="beir", format="beir"))
    assert (report.added, report.failed) == (2, 1)
    summaries, _ = await runtime.catalog.list("beir")
    assert sorted(s.source_uri for s in summaries) == ["4983", "5836"]
    hits = await runtime.store.text_search("myelodysplasia", SearchFilter(collection="beir"), 5)
    assert hits[0].source_uri == "5836" and hits[0].text.startswith("Induction of myelodysplasia")


async def test_jsonl_without_beir_format_is_a_clear_failure(runtime: Runtime, tmp_path: Path) -> None:
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"_id": "1", "text": "x"}\n')
    report = await runtime.ingestor().ingest_paths([corpus], IngestOptions(collection="x"))
    assert report.failed == 1 and "--format beir" in report.errors[0]["error"]


async def test_hierarchical_ingest_stores_parents_without_vectors(migrated_url: str, local_embedder,
                                                                 tmp_path: Path) -> None:
    rt = Runtime.open(load_settings(database_url=migrated_url, chunk_size=32, chunk_overlap=4,
                                    chunk_hierarchical=True, parent_chunk_size=96))
    rt.embedder = local_embedder
    try:
        (tmp_path / "h.txt").write_text(LONG_SECTION)
        report = await rt.ingestor().ingest_paths([tmp_path / "h.txt"], IngestOptions(collection="hier"))
        summaries, _ = await rt.catalog.list("hier")
        _, chunks = await rt.catalog.get(summaries[0].id)
        parents = [c for c in chunks if not c.embedded]
        children = [c for c in chunks if c.embedded]
        assert parents and children and report.chunks_embedded == len(children)
        assert all(c.parent_id in {p.id for p in parents} for c in children)
    finally:
        await rt.close()


async def test_prune_is_skipped_when_a_corpus_row_cannot_be_read(runtime: Runtime, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    rows = [{"_id": "a", "text": "alpha text"}, {"_id": "b", "text": "beta text"}]
    corpus.write_text("\n".join(json.dumps(r) for r in rows))
    options = IngestOptions(collection="beir-prune", format="beir", prune=True)
    await runtime.ingestor().ingest_paths([corpus], options)
    corpus.write_text(json.dumps(rows[0]) + "\n{broken row")
    report = await runtime.ingestor().ingest_paths([corpus], options)
    assert report.deleted == 0
    assert any(e["source"] == "--prune" and "skipped" in e["error"] for e in report.errors)
    _, total = await runtime.catalog.list("beir-prune")
    assert total == 2


async def test_a_repeated_source_uri_is_reported_not_fatal(runtime: Runtime, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    rows = [{"_id": "same", "text": "first copy"}, {"_id": "other", "text": "other text"},
            {"_id": "same", "text": "second copy"}]
    corpus.write_text("\n".join(json.dumps(r) for r in rows))
    report = await runtime.ingestor().ingest_paths([corpus], IngestOptions(collection="dupes", format="beir"))
    assert (report.added, report.failed) == (2, 1)
    assert "twice" in report.errors[0]["error"]
    hits = await runtime.store.text_search("copy", SearchFilter(collection="dupes"), 5)
    assert [h.text for h in hits] == ["first copy"]
