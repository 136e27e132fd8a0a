"""Tenants and ACLs: no request shows one tenant's or one principal's documents to another.

Two tenants (the default one, whose collection keys are bare names, and ``acme``, whose keys are
``acme/...``) each have a collection named ``kb`` holding three planted documents: a public one,
one only ``p1`` may read and one only ``p2`` may read. Every document carries the same phrase
("quarterly ledger reconciliation"), so a search that forgot a tenant or ACL filter would return
the others', plus an identifier and a word of its own. Each tenant has a reader key per principal,
an ingester, a reviewer and an admin.

The enumeration: every reader x every retrieval strategy alone, fused, and with the adaptive loop's
relaxations x every planted query (the shared phrase, each identifier, each word); the query API,
its stream and a conversation id both tenants use; documents, jobs, answers, traces, reviews, eval
runs, the shared prompts and the MCP tools by both tenants' keys. A hit, citation, id or planted
token outside the caller's visible set is a leak; each check also asserts that the caller's own
documents are found, so an empty answer cannot pass. Then BM25's statistics: what they can and
cannot reveal (see the README's "Tenants" section).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest

from rag_service.config import load_settings
from rag_service.db.engine import Database
from rag_service.db.repos.eval_runs import EvalRunRepository
from rag_service.domain import DatasetRef, EvalRunRequest, collection_key
from tests.apps import served, wait_for_job
from tests.tenant_world import PLANTED, PRINCIPALS, READERS, SHARED, TENANTS, Planted, World, keys_for, reader
from tests.test_auth import bearer
from tests.test_mcp import _json, over_http

STRATEGY_SETS: list[tuple[list[str] | None, bool]] = [
    (["semantic"], False), (["keyword"], False), (["pattern"], False), (["metadata"], False),
    (None, False), (None, True),  # fused; and with the adaptive loop's relaxations
]


def _wait(world: World, status_url: str, key: str) -> dict[str, Any]:
    return wait_for_job(lambda url: world.get(url, key), status_url)


@pytest.fixture(scope="module")
def world(migrated_url: str) -> Iterator[World]:
    keys = keys_for(migrated_url)
    settings = load_settings(database_url=migrated_url, serve_worker="on", worker_heartbeat_s=1, experiment_check_s=0)
    with served(settings) as base:
        w = World(base, migrated_url, keys)
        for tenant in TENANTS:
            w.jobs[tenant] = set()
            for acl in (None, *PRINCIPALS):  # one job per ACL: a batch shares its ACL
                docs = [d for d in PLANTED if d.tenant == tenant and d.acl == acl]
                accepted = w.post("/v1/documents", f"{tenant}-ingester", [
                    {"source_uri": d.uri, "title": d.uri, "text": d.text, "collection": "kb", "tags": ["planted"],
                     "lob": "finance", "acl": [acl] if acl else [], "metadata": {"plant": d.ident}} for d in docs])
                assert accepted.status_code == 202, accepted.text
                job = _wait(w, accepted.json()["status_url"], f"{tenant}-ingester")
                assert job["status"] == "succeeded", job
                w.jobs[tenant].add(accepted.json()["job_id"])
            listed = w.get("/v1/documents", f"{tenant}-admin", collection="kb", limit=50).json()["data"]
            w.ids.update({d["source_uri"]: d["id"] for d in listed})
        assert len(w.ids) == len(PLANTED)
        yield w


def test_every_strategy_returns_only_the_callers_tenant_and_principal(world: World) -> None:
    found: dict[tuple[str, str, str], set[str]] = {}
    searches = 0
    for tenant, principal in READERS:
        visible = world.visible(tenant, principal)
        for strategies, adaptive in STRATEGY_SETS:
            label = "+".join(strategies or ["fused"]) + ("+adaptive" if adaptive else "")
            for query in [SHARED] + [d.ident for d in PLANTED] + [d.word for d in PLANTED]:
                response = world.post("/v1/search", reader(tenant, principal), {
                    "query": query, "collection": "kb", "strategies": strategies, "adaptive": adaptive,
                    "top_k": 20, "filters": {"tags_any": ["planted"]}})
                assert response.status_code == 200, (label, query, response.text)
                searches += 1
                hits = {r["document_id"] for r in response.json()["results"]}
                assert hits <= visible, f"leak: {tenant}/{principal} {label} {query!r} -> {hits - visible}"
                body = json.dumps(response.json()["results"])  # (the response echoes the query itself)
                assert not [t for t in world.hidden_tokens(tenant, principal) if t in body], (label, query)
                assert response.json()["collection"] == "kb"  # the name, never the stored key
                found.setdefault((tenant, principal, label), set()).update(hits)
    # Not vacuous: each strategy found every document its caller may read.
    for (tenant, principal, label), hits in found.items():
        assert hits == world.visible(tenant, principal), (tenant, principal, label)
    assert searches == len(READERS) * len(STRATEGY_SETS) * (1 + 2 * len(PLANTED))


def _question(d: Planted) -> str:
    return f"Which code does the {SHARED} of {d.tenant} for {d.acl or 'everyone'} use?"


def test_answers_streams_and_conversations_cite_only_what_the_caller_may_read(world: World) -> None:
    cited_any: set[str] = set()
    for tenant, principal in READERS:
        visible, hidden = world.visible(tenant, principal), world.hidden_tokens(tenant, principal)
        for d in PLANTED:
            response = world.post("/v1/query", reader(tenant, principal), {"question": _question(d),
                                                                            "collection": "kb"})
            assert response.status_code == 200, response.text
            cited = {c["document_id"] for c in response.json()["citations"]}
            assert cited <= visible, (tenant, principal, d.uri)
            assert not [t for t in hidden if t in response.text], (tenant, principal, d.uri)
            cited_any |= cited
        key = world.keys[reader(tenant, principal)]
        with httpx.stream("POST", f"{world.base}/v1/query/stream", headers=bearer(key),
                          json={"question": _question(PLANTED[0]), "collection": "kb"}, timeout=120) as stream:
            assert stream.status_code == 200
            text = "".join(stream.iter_text())
        assert "event: done" in text or "event: answer" in text or "citation" in text, text[:500]
        assert not [t for t in hidden if t in text]
    assert cited_any == set(world.ids.values())  # every document was cited by someone allowed to

    # One conversation id used by both tenants: the second tenant's follow-up reads nothing of the
    # first's. Within one tenant the same follow-up is resolved from the earlier turn (so the check can fail).
    marker = "zephyrine"
    for tenant in TENANTS:
        first = world.post("/v1/query", reader("default", "p1"), {
            "question": f"Which code does the {marker} {SHARED} of default for p1 use?", "collection": "kb",
            "conversation_id": f"shared-conversation-{tenant}"})
        assert first.status_code == 200 and PLANTED[1].ident in first.text
        follow_up = world.post("/v1/query", reader(tenant, "p1"), {
            "question": "And what was its codeword?", "collection": "kb",
            "conversation_id": f"shared-conversation-{tenant}"})
        assert follow_up.status_code == 200, follow_up.text
        trace = world.get(f"/v1/queries/{follow_up.json()['query_id']}/trace", reader(tenant, "p1")).text
        assert (marker in trace) == (tenant == "default"), (tenant, trace[:400])
        assert not [t for t in world.hidden_tokens(tenant, "p1") if t in follow_up.text]


def test_documents_and_jobs_are_the_tenants_own(world: World) -> None:
    for tenant, principal in READERS:
        key = reader(tenant, principal)
        listed = {d["id"] for d in world.get("/v1/documents", key, limit=100).json()["data"]}
        assert listed == world.visible(tenant, principal)
        for d in PLANTED:
            status = world.get(f"/v1/documents/{world.ids[d.uri]}", key).status_code
            assert status == (200 if d.visible_to(tenant, principal) else 404), (key, d.uri)
    for tenant in TENANTS:
        other = next(t for t in TENANTS if t != tenant)
        jobs = world.get("/v1/jobs", f"{tenant}-ingester", limit=100).json()
        assert {j["id"] for j in jobs["data"]} == world.jobs[tenant] and jobs["count"] == len(world.jobs[tenant])
        assert all(j["collection"] == "kb" for j in jobs["data"])
        for job_id in world.jobs[other]:
            assert world.get(f"/v1/jobs/{job_id}", f"{tenant}-admin").status_code == 404
        victim = world.ids[f"{other}-public.md"]
        deleted = httpx.delete(f"{world.base}/v1/documents/{victim}", headers=bearer(world.keys[f"{tenant}-admin"]))
        assert deleted.status_code == 404
        assert world.get(f"/v1/documents/{victim}", f"{other}-admin").status_code == 200  # still there


def test_answers_traces_and_reviews_stay_in_their_tenant(world: World) -> None:
    asked: dict[str, str] = {}
    for tenant in TENANTS:
        response = world.post("/v1/query", reader(tenant, "p1"), {"question": _question(PLANTED[0]),
                                                                    "collection": "kb"})
        asked[tenant] = response.json()["query_id"]
        receipt = world.post(f"/v1/answers/{asked[tenant]}/feedback", reader(tenant, "p1"),
                             {"rating": 1, "comment": f"wrong for {tenant}"})
        assert receipt.status_code == 201 and receipt.json()["review_id"], receipt.text
    for tenant in TENANTS:
        other = next(t for t in TENANTS if t != tenant)
        reviewer = f"{tenant}-reviewer"
        assert world.get(f"/v1/answers/{asked[tenant]}", reviewer).status_code == 200
        assert world.get(f"/v1/queries/{asked[tenant]}/trace", reviewer).json()["collection"] == "kb"
        assert world.get(f"/v1/answers/{asked[other]}", reviewer).status_code == 404
        assert world.get(f"/v1/queries/{asked[other]}/trace", reviewer).status_code == 404
        feedback = world.post(f"/v1/answers/{asked[other]}/feedback", reader(tenant, "p1"), {"rating": 5})
        assert feedback.status_code == 404
        items = world.get("/v1/reviews", reviewer, limit=200).json()["data"]
        answers = {i["answer_id"] for i in items}
        assert asked[tenant] in answers and asked[other] not in answers
        assert f"wrong for {other}" not in json.dumps(items) and {i["collection"] for i in items} == {"kb"}
        others = world.get("/v1/reviews", f"{other}-reviewer", limit=200).json()["data"]
        assert others and not answers & {i["answer_id"] for i in others}
        if tenant == "acme":  # corrections would become versions of the prompt every tenant shares
            mine = items[0]["id"]
            assert world.post(f"/v1/reviews/{mine}/claim", reviewer, {}).status_code == 200
            decided = world.post(f"/v1/reviews/{mine}/decision", reviewer, {
                "decision": "edited", "category": "answer_quality", "corrected_answer": "ACM-201",
                "corrected_prompt": "Answer: {question}"})
            assert decided.status_code == 403 and "corrected_prompt" in decided.json()["detail"], decided.text
        for item in others:
            assert world.get(f"/v1/reviews/{item['id']}", reviewer).status_code == 404
            assert world.post(f"/v1/reviews/{item['id']}/claim", reviewer, {}).status_code == 404
            assert world.get(f"/v1/answers/{item['answer_id']}", reviewer).status_code == 404
        stats = world.get("/v1/reviews/stats", reviewer).json()
        assert sum(stats["by_status"].values()) == len(items)


def test_eval_runs_and_the_shared_configuration(world: World) -> None:
    async def create_runs() -> dict[str, str]:
        db = Database.from_settings(load_settings(database_url=world.url), url=world.url)
        runs = EvalRunRepository(db)
        try:
            made = {}
            for tenant in TENANTS:
                run = await runs.create(
                    name=f"{tenant}-run", dataset=DatasetRef(kind="qa", name="planted", version="v1", items=1),
                    request=EvalRunRequest(dataset="golden"), collection=collection_key(tenant, "kb"),
                    config={}, config_hash="h", code_version=None, items_total=1)
                made[tenant] = str(run.id)
            return made
        finally:
            await db.dispose()

    made = asyncio.run(create_runs())
    for tenant in TENANTS:
        other = next(t for t in TENANTS if t != tenant)
        listed = world.get("/v1/eval-runs", f"{tenant}-reviewer").json()
        assert [r["id"] for r in listed["data"]] == [made[tenant]] and listed["data"][0]["collection"] == "kb"
        assert world.get(f"/v1/eval-runs/{made[other]}", f"{tenant}-reviewer").status_code == 404
        assert world.get(f"/v1/eval-runs/{made[tenant]}/compare", f"{tenant}-reviewer",
                         against=f"{other}-run").status_code == 404
    # Datasets on the server's disk are the operator's; a name with a "/" is not a collection name.
    assert world.post("/v1/eval-runs", "acme-admin", {"dataset": "qa:/etc/hostname"}).status_code == 403
    assert world.post("/v1/eval-runs", "acme-admin", {"dataset": "golden", "collection": "x/kb"}).status_code == 422

    # Prompts, guidelines, experiments and the process's figures serve every tenant: the default tenant's keys only.
    assert world.get("/v1/prompts", "default-reviewer").status_code == 200
    refused = world.get("/v1/prompts", "acme-reviewer")
    assert refused.status_code == 403 and "default" in refused.json()["detail"]
    for path in ("/v1/experiments", "/v1/guidelines", "/metrics", "/v1/health/queues"):
        assert world.get(path, "acme-admin").status_code == 403, path
        assert world.get(path, "default-admin").status_code == 200, path
    guidelines = world.get("/v1/guidelines", "default-admin").json()
    put = httpx.put(f"{world.base}/v1/guidelines", headers=bearer(world.keys["acme-admin"]),
                    json={"guidelines": guidelines["guidelines"], "comment": "takeover"})
    assert put.status_code == 403


async def test_mcp_tools_and_resources_by_tenant(world: World) -> None:
    for tenant, principal in READERS:
        visible = world.visible(tenant, principal)
        async with over_http(world.base, world.keys[reader(tenant, principal)]) as client:
            collections = _json(await client.call_tool("list_collections", {}))
            assert [(c["name"], c["documents"]) for c in collections["data"]] == [("kb", len(visible))]
            hits = _json(await client.call_tool("search", {"query": SHARED, "collection": "kb", "top_k": 20}))
            assert {r["document_id"] for r in hits["results"]} == visible
            # A name holding the tenant separator could address another tenant's stored key: refused.
            other = "acme" if tenant == "default" else "x"
            with pytest.raises(Exception, match="not a collection name"):
                await client.read_resource(f"ragsvc://collections/{other}%2Fkb/documents")
            for d in PLANTED:
                uri = f"ragsvc://documents/{world.ids[d.uri]}"
                if d.visible_to(tenant, principal):
                    assert (await client.read_resource(uri)).contents
                else:
                    with pytest.raises(Exception, match="no document"):
                        await client.read_resource(uri)


def _keyword_scores(world: World, key: str) -> list[tuple[str, float]]:
    response = world.post("/v1/search", key, {"query": SHARED, "collection": "kb", "strategies": ["keyword"],
                                              "top_k": 20, "rerank": False})
    return [(r["document_id"], r["strategy_scores"]["keyword"]) for r in response.json()["results"]]


def test_bm25_statistics_reveal_nothing_across_tenants_and_no_hidden_document(world: World) -> None:
    """BM25's document frequencies and average length are per collection, so another tenant's
    documents never change a tenant's scores. Within a collection they count every document, the
    ones a principal may not read too: a caller can see a score move when hidden documents with
    its terms are added, but never a hidden document's id, text, title or count."""
    acme_before = _keyword_scores(world, reader("acme", "p1"))
    p1_before = _keyword_scores(world, reader("default", "p1"))
    added = world.post("/v1/documents", "default-ingester", [
        {"source_uri": f"hidden-{i}.md", "text": f"The {SHARED} ledger entry {i} for the p2 team.",
         "collection": "kb", "acl": ["p2"]} for i in range(20)])
    assert added.status_code == 202
    assert _wait(world, added.json()["status_url"], "default-ingester")["status"] == "succeeded"
    try:
        assert _keyword_scores(world, reader("acme", "p1")) == acme_before  # the other tenant: bit for bit
        p1_after = _keyword_scores(world, reader("default", "p1"))
        assert [d for d, _ in p1_after] == [d for d, _ in p1_before]  # the same hits, none of the hidden ones
        assert [s for _, s in p1_after] != [s for _, s in p1_before]  # but the scores moved: what df reveals
    finally:
        listed = world.get("/v1/documents", "default-admin", collection="kb", limit=100).json()["data"]
        for d in listed:
            if d["source_uri"].startswith("hidden-"):
                httpx.delete(f"{world.base}/v1/documents/{d['id']}", headers=bearer(world.keys["default-admin"]))


# Last: it deletes one of the module's tenants.
def test_tenant_delete_removes_everything_of_the_tenant_and_nothing_else(world: World,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from rag_service.cli import app

    by_collection_id = ("documents", "chunks", "keyword_postings", "keyword_stats")

    def connect() -> psycopg.Connection:
        return psycopg.connect(world.url.replace("postgresql+psycopg://", "postgresql://", 1))

    def rows_by_tenant() -> dict[str, dict[str, int]]:
        with connect() as conn:
            counts = {table: dict(conn.execute(
                f"SELECT ragsvc_tenant_of(collection), count(*) FROM {table} GROUP BY 1").fetchall())
                for table in ("ingest_jobs", "queries", "review_items", "conversations", "query_traces", "eval_runs")}
            joins = {table: f"{table} d JOIN collections c ON c.id = d.collection_id" for table in by_collection_id}
            joins |= {"answers": "answers d JOIN queries c ON c.id = d.query_id", "api_keys": "api_keys c"}
            for table, join in joins.items():
                column = "ragsvc_tenant_of(c.collection)" if table == "answers" else "c.tenant"
                counts[table] = dict(conn.execute(f"SELECT {column}, count(*) FROM {join} GROUP BY 1").fetchall())
        return counts

    before = rows_by_tenant()
    assert all(before[t].get("acme") for t in ("ingest_jobs", "queries", "review_items", "query_traces", "eval_runs",
                                               "documents", "chunks", "keyword_postings", "keyword_stats", "answers",
                                               "api_keys"))
    monkeypatch.setenv("RAGSVC_DATABASE_URL", world.url)
    result = CliRunner().invoke(app, ["tenant", "delete", "acme", "--yes", "--json"])
    assert result.exit_code == 0, result.output
    deleted = json.loads(result.stdout)["deleted"]
    assert deleted["collections"] == 1 and deleted["documents"] == 3 and deleted["api_keys"] == 5
    after = rows_by_tenant()
    assert all("acme" not in after[table] for table in after), after
    with connect() as conn:  # nor rows of a collection that is gone
        for table in by_collection_id:
            assert conn.execute(f"SELECT count(*) FROM {table} WHERE collection_id NOT IN "
                                "(SELECT id FROM collections)").fetchone()[0] == 0, table
    assert all(after[table].get("default") == before[table].get("default") for table in after)  # untouched
    # The keys are gone: a running server refuses them once its key cache (5 s) lapses.
    deadline = time.monotonic() + 15
    while world.get("/v1/documents", reader("acme", "p1")).status_code != 401:
        assert time.monotonic() < deadline
        time.sleep(0.5)
    assert world.get("/v1/documents", reader("default", "p1")).status_code == 200
    listed = CliRunner().invoke(app, ["tenant", "list", "--json"])
    assert [t["tenant"] for t in json.loads(listed.stdout)["data"]] == ["default"]
