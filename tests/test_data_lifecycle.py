"""Deleting a document (issue 14, data lifecycle), on a real PostgreSQL with the local model: its
chunks and keyword postings go, and the answers that cited it stay readable with those citations
marked deleted and no longer quoting it; its passages in stored traces are marked deleted too. Both
ways a document goes: ``DELETE /v1/documents/{id}`` and re-ingestion with ``--prune``; and an
answer being logged while its document is deleted, in either order."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from ingestion.pipeline import IngestOptions
from rag_service.api import create_app
from rag_service.config import load_settings
from rag_service.db.engine import Database
from rag_service.db.repos.answers import forget_documents
from rag_service.db.repos.query_log import QueryLog, write_entry
from rag_service.domain import AnswerLogEntry, DocumentRecord, QueryLogEntry
from rag_service.runtime import Runtime
from rag_service.stores.pgvector import PgVectorStore
from tests.apps import ingest_and_wait
from tests.dbrun import run_on
from tests.fake_openai import Reply, fake_openai

# Each document has words the other lacks, so a keyword search can tell whether one is still there.
COMETS = ("Halley's comet returns to the inner solar system roughly every seventy-six years. "
          "Its nucleus is a loose aggregate of ice and dust, about fifteen kilometres long.")
BREAD = "Knead the dough for ten minutes, then let it rise for about an hour."
QUESTION = "How often does Halley's comet return, and how long should bread dough rise?"
# An LLM answer in its own words: what it quotes from the documents is only in its citations.
ANSWER = "Every 76 years or so, and sixty minutes of proving [1] [2]."
REPLY = json.dumps({"reasoning_steps": ["[1] and [2] answer the two parts"], "confidence": 0.9,
                    "citations": [1, 2], "answer": ANSWER})
COMET_WORDS = ("seventy-six", "nucleus", "aggregate", "fifteen kilometres")


@pytest.fixture(scope="module")
def client(migrated_url: str) -> Iterator[TestClient]:
    with fake_openai() as llm:
        llm.default = Reply(REPLY)
        settings = load_settings(database_url=migrated_url, serve_worker="on", worker_heartbeat_s=1,
                                 llm_base_url=llm.url, llm_api_key="k", llm_timeout_s=10, adaptive_retrieval=False,
                                 eval_llm_judge=False, eval_ragas=False)
        with TestClient(create_app(settings)) as client:
            yield client


def _ingest(client: TestClient, collection: str) -> None:
    ingest_and_wait(client, [
        {"source_uri": "comets.md", "title": "Comets", "text": COMETS, "collection": collection},
        {"source_uri": "bread.md", "title": "Bread", "text": BREAD, "collection": collection}])


def _ask(client: TestClient, collection: str) -> dict[str, Any]:
    answer = client.post("/v1/query", json={"question": QUESTION, "collection": collection}).json()
    assert answer["outcome"] == "answered" and answer["generator"] == "llm", answer
    assert _by_source(answer["citations"]).keys() == {"comets.md", "bread.md"}, answer["citations"]
    return answer


def _by_source(citations: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """By file name (an ingested file's source is its file:// URI)."""
    return {c["source_uri"].rsplit("/", 1)[-1]: c for c in citations}


def _stored(url: str, collection: str, document_id: str) -> dict[str, Any]:
    """The document's chunk and posting rows, and its collection's keyword statistics."""

    async def read(db: Database) -> dict[str, Any]:
        async with db.connect() as conn:
            one = (await conn.execute(text(
                "SELECT (SELECT count(*) FROM chunks WHERE document_id = :d) AS chunks, "
                "(SELECT count(*) FROM keyword_postings WHERE document_id = :d) AS postings, "
                "(SELECT count(*) FROM documents WHERE id = :d) AS documents"), {"d": document_id})).one()
            stats = (await conn.execute(text(
                "SELECT sum(s.chunk_count), sum(s.total_length) FROM keyword_stats s JOIN collections c "
                "ON c.id = s.collection_id WHERE c.name = :c"), {"c": collection})).one()
        return {**one._asdict(), "stats": tuple(stats)}

    return run_on(url, read)


def _golden_citations(url: str) -> list[list[dict[str, Any]]]:
    async def read(db: Database) -> list[list[dict[str, Any]]]:
        async with db.connect() as conn:
            return list((await conn.execute(text("SELECT citations FROM golden_items ORDER BY id"))).scalars())

    return run_on(url, read)


def _keyword_hits(client: TestClient, collection: str) -> list[str]:
    body = client.post("/v1/search", json={"query": " ".join(COMET_WORDS), "collection": collection,
                                           "strategies": ["keyword", "pattern"], "rerank": False,
                                           "adaptive": False}).json()
    return list(_by_source(body["results"]))


def _assert_forgotten(before: dict[str, Any], after: dict[str, Any], trace_after: dict[str, Any]) -> None:
    """The answer after its comets.md citation was forgotten, against the same answer before."""
    assert after["answer"] == before["answer"] == ANSWER  # the answer stays readable, word for word
    cited_before, cited_after = _by_source(before["citations"]), _by_source(after["citations"])
    assert cited_before["comets.md"]["quote"] and not cited_before["comets.md"]["deleted"]
    gone = cited_after["comets.md"]
    assert gone["deleted"] is True and gone["quote"] == ""
    # Where it pointed is kept, so the reader can tell what was cited.
    keep = ("n", "chunk_id", "document_id", "title", "start_char", "end_char", "verified")
    assert {k: gone[k] for k in keep} == {k: cited_before["comets.md"][k] for k in keep}
    assert cited_after["bread.md"] == cited_before["bread.md"]  # untouched
    assert [c["n"] for c in after["citations"]] == [c["n"] for c in before["citations"]]  # order kept
    passages = _by_source(trace_after["candidates"])
    assert passages["comets.md"]["deleted"] is True and passages["bread.md"]["deleted"] is False
    for body in (json.dumps(after), json.dumps(trace_after)):
        for words in COMET_WORDS + (COMETS[:40],):
            assert words not in body, words


def test_deleting_a_document_forgets_it_in_answers_and_traces(client: TestClient, migrated_url: str) -> None:
    _ingest(client, "kb")
    asked = _ask(client, "kb")
    qid = asked["query_id"]
    comets = _by_source(asked["citations"])["comets.md"]["document_id"]
    before, trace_before = client.get(f"/v1/answers/{qid}").json(), client.get(f"/v1/queries/{qid}/trace").json()
    assert _by_source(trace_before["candidates"]).keys() >= {"comets.md", "bread.md"}
    assert any(w in json.dumps(before) for w in COMET_WORDS)  # what must go is there to begin with
    # A reviewer approves it: the golden item copies the citations, quotes included.
    assert client.post(f"/v1/answers/{qid}/feedback", json={"rating": 1}).status_code == 201
    review_id = client.get(f"/v1/answers/{qid}").json()["review_id"]
    assert client.post(f"/v1/reviews/{review_id}/claim").status_code == 200
    decided = client.post(f"/v1/reviews/{review_id}/decision", json={"decision": "approved",
                                                                    "category": "answer_quality"})
    assert decided.status_code == 201, decided.text
    assert [_by_source(g)["comets.md"]["quote"] for g in _golden_citations(migrated_url)] == [
        _by_source(before["citations"])["comets.md"]["quote"]]
    stored = _stored(migrated_url, "kb", comets)
    assert stored["chunks"] > 0 and stored["postings"] > 0
    assert _keyword_hits(client, "kb") == ["comets.md"]

    assert client.delete(f"/v1/documents/{comets}").status_code == 204

    gone = _stored(migrated_url, "kb", comets)
    assert (gone["documents"], gone["chunks"], gone["postings"]) == (0, 0, 0)
    assert gone["stats"][0] < stored["stats"][0] and gone["stats"][1] < stored["stats"][1]
    assert _keyword_hits(client, "kb") == []
    assert client.get(f"/v1/documents/{comets}").status_code == 404
    after = client.get(f"/v1/answers/{qid}")
    assert after.status_code == 200, after.text
    trace_after = client.get(f"/v1/queries/{qid}/trace")
    assert trace_after.status_code == 200, trace_after.text
    _assert_forgotten(before, after.json(), trace_after.json())
    # The reviewer's view: the citation forgotten, the passage it read no longer there to show.
    item = client.get(f"/v1/reviews/{review_id}").json()
    assert not any(w in json.dumps(item) for w in COMET_WORDS)
    (golden,) = _golden_citations(migrated_url)
    assert _by_source(golden)["comets.md"]["deleted"] is True and _by_source(golden)["comets.md"]["quote"] == ""
    assert _by_source(golden)["bread.md"] == _by_source(before["citations"])["bread.md"]
    # Deleting again finds nothing, and changes nothing.
    assert client.delete(f"/v1/documents/{comets}").status_code == 404
    assert client.get(f"/v1/answers/{qid}").json() == after.json()


def test_pruning_a_document_forgets_it_in_answers_and_traces(client: TestClient, migrated_url: str,
                                                             local_embedder, tmp_path: Path) -> None:
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "comets.md").write_text(f"# Comets\n\n{COMETS}\n")
    (folder / "bread.md").write_text(f"# Bread\n\n{BREAD}\n")

    async def ingest(prune: bool) -> int:
        runtime = Runtime.open(load_settings(database_url=migrated_url))
        runtime.embedder = local_embedder
        try:
            report = await runtime.ingestor().ingest_paths([folder], IngestOptions(collection="pruned", prune=prune))
        finally:
            await runtime.close()
        assert report.failed == 0, report.errors
        return report.deleted

    assert asyncio.run(ingest(prune=False)) == 0
    asked = _ask(client, "pruned")
    qid = asked["query_id"]
    comets = _by_source(asked["citations"])["comets.md"]["document_id"]
    before = client.get(f"/v1/answers/{qid}").json()
    stored = _stored(migrated_url, "pruned", comets)
    assert stored["chunks"] > 0 and stored["postings"] > 0

    (folder / "comets.md").unlink()
    assert asyncio.run(ingest(prune=True)) == 1

    gone = _stored(migrated_url, "pruned", comets)
    assert (gone["documents"], gone["chunks"], gone["postings"]) == (0, 0, 0)
    assert gone["stats"][0] < stored["stats"][0] and gone["stats"][1] < stored["stats"][1]
    assert _keyword_hits(client, "pruned") == []
    after = client.get(f"/v1/answers/{qid}")
    assert after.status_code == 200, after.text
    _assert_forgotten(before, after.json(), client.get(f"/v1/queries/{qid}/trace").json())


# An answer being logged while the document it cites is deleted: whichever transaction takes the
# document's row first, the other waits, and the answer ends up with the citation forgotten.

def _logged(query_id: uuid.UUID, document_id: uuid.UUID) -> QueryLogEntry:
    citation = {"n": 1, "chunk_id": str(uuid.uuid4()), "document_id": str(document_id), "source_uri": "race.md",
                "title": "Race", "start_char": 0, "end_char": 11, "quote": "secret text", "verified": True}
    return QueryLogEntry(
        query_id=query_id, conversation_id=None, collection="race", principals=[], question="What is it?",
        resolved_question=None, intent={}, route={}, guardrails={}, outcome="answered", subject=None,
        answer=AnswerLogEntry(text="It is that [1].", short=None, citations=[citation], confidence=0.9,
                              generator="llm", model=None, prompt_name=None, prompt_version=None, timings={}))


async def _race_document(database: Database) -> uuid.UUID:
    return await PgVectorStore(database, ef_search=40).upsert_document(DocumentRecord(
        collection="race", source_uri=f"race-{uuid.uuid4().hex}.md", content_hash="h"))


async def _citations(database: Database, query_id: uuid.UUID) -> list[dict[str, Any]]:
    async with database.connect() as conn:
        return (await conn.execute(text("SELECT citations FROM answers WHERE query_id = :q"),
                                   {"q": query_id})).scalar_one()


async def test_an_answer_logged_after_its_document_went_forgets_it(database: Database) -> None:
    document = await _race_document(database)
    assert await PgVectorStore(database, ef_search=40).delete_document(document, before_delete=forget_documents)
    query_id = uuid.uuid4()
    await QueryLog(database).record(_logged(query_id, document))
    (cited,) = await _citations(database, query_id)
    assert cited["deleted"] is True and cited["quote"] == "" and cited["document_id"] == str(document)


async def test_a_delete_waits_for_an_answer_being_logged_and_then_forgets_it(database: Database) -> None:
    document, query_id = await _race_document(database), uuid.uuid4()
    store = PgVectorStore(database, ef_search=40)
    async with database.begin() as logging:  # QueryLog.record's transaction, held open
        await write_entry(logging, _logged(query_id, document))
        deleting = asyncio.create_task(store.delete_document(document, before_delete=forget_documents))
        await asyncio.sleep(0.5)
        assert not deleting.done()  # it waits for the answer's commit
    assert await asyncio.wait_for(deleting, 30) is True
    (cited,) = await _citations(database, query_id)
    assert cited["deleted"] is True and cited["quote"] == ""


async def test_an_answer_logged_during_a_delete_waits_and_then_forgets_it(database: Database) -> None:
    document, query_id = await _race_document(database), uuid.uuid4()
    async with database.begin() as deleting:  # what the store's delete_document does, held open
        await forget_documents(deleting, [document])
        logging = asyncio.create_task(QueryLog(database).record(_logged(query_id, document)))
        await asyncio.sleep(0.5)
        assert not logging.done()  # it waits for the delete to commit or roll back
        await deleting.execute(text("DELETE FROM documents WHERE id = :d"), {"d": document})
    await asyncio.wait_for(logging, 30)
    (cited,) = await _citations(database, query_id)
    assert cited["deleted"] is True and cited["quote"] == ""
