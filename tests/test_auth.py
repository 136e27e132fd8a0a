"""API keys and roles: every /v1 operation against a key of each role (real database), revoked
keys, hashed storage, the loopback rule, and a key's scope (principals and collections)."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg
import pytest
from fastapi.testclient import TestClient

from rag_service.api import auth as api_auth
from rag_service.api import create_app
from rag_service.api.auth import (
    LOCAL_ADMIN,
    REQUIRED_ROLE,
    check_exposure,
    is_loopback,
    scope_principals,
    scoped,
    scoped_collection,
)
from rag_service.config import load_settings
from rag_service.db.engine import Database
from rag_service.db.repos import ApiKeyRepository
from rag_service.domain import GRANTS, ROLES, Caller, QueryRequest, SearchRequest
from rag_service.errors import ConfigError, ForbiddenError

T = TypeVar("T")

DOCS = [
    ("kb", "public.md", [], "Falcon is the name of the public mascot of the company."),
    ("kb", "legal.md", ["legal"], "Project Falcon will acquire a competitor next quarter."),
    ("kb", "hr.md", ["hr"], "The Falcon team salaries rise next quarter."),
    ("other", "notes.md", [], "Falcon notes kept in another collection."),
]


def with_keys(url: str, work: Callable[[ApiKeyRepository], Awaitable[T]], ttl_s: float = 5.0) -> T:
    """Run ``work`` on a repository of its own (as another process would)."""

    async def run() -> T:
        db = Database.from_settings(load_settings(database_url=url), url=url)
        try:
            return await work(ApiKeyRepository(db, ttl_s=ttl_s))
        finally:
            await db.dispose()

    return asyncio.run(run())


def create_key(url: str, role: str, **scope: Any) -> str:
    return with_keys(url, lambda repo: repo.create(role, **scope))[1]  # type: ignore[arg-type]


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def keys(migrated_url: str) -> dict[str, str]:
    return {role: create_key(migrated_url, role, name=f"{role}-key") for role in ROLES}


@pytest.fixture(scope="module")
def client(migrated_url: str, keys: dict[str, str]):
    settings = load_settings(database_url=migrated_url, serve_worker="on", worker_heartbeat_s=1)
    with TestClient(create_app(settings)) as test_client:
        admin = bearer(keys["admin"])
        for collection, uri, acl, text in DOCS:
            accepted = test_client.post("/v1/documents", headers=admin, json={
                "source_uri": uri, "collection": collection, "acl": acl, "text": text})
            assert accepted.status_code == 202, accepted.text
            deadline = time.monotonic() + 120
            while (job := test_client.get(accepted.json()["status_url"], headers=admin).json())["status"] not in (
                    "succeeded", "failed"):
                assert time.monotonic() < deadline
                time.sleep(0.2)
            assert job["status"] == "succeeded", job
        yield test_client


def _operations(client: TestClient) -> list[tuple[str, str, dict[str, Any]]]:
    spec = client.get("/openapi.json").json()
    return [(method.upper(), path, op) for path, ops in spec["paths"].items() if path.startswith("/v1/")
            for method, op in ops.items()]


def _call(client: TestClient, method: str, path: str, headers: dict[str, str] | None = None):
    # Path parameters get a random UUID (an unknown id: 404 or 422 count as "let in"); bodies are
    # empty (422): the role is checked before the body is read.
    url = re.sub(r"\{[^}]+\}", str(uuid.uuid4()), path)
    body = {"json": {}} if method in ("POST", "PUT", "PATCH") else {}
    return client.request(method, url, headers=headers or {}, **body)


def test_every_v1_operation_declares_its_role(client: TestClient) -> None:
    operations = _operations(client)
    assert len(operations) >= 11
    spec = client.get("/openapi.json").json()
    assert spec["components"]["securitySchemes"]["bearer"] == {
        "type": "http", "scheme": "bearer", "bearerFormat": "rsk_...",
        "description": "An API key made with `ragsvc keys create --role ROLE`."}
    undeclared = [f"{m} {p}" for m, p, op in operations if op.get(REQUIRED_ROLE) not in ROLES]
    assert not undeclared, f"routes without a role: add **role('...') from rag_service.api.auth to {undeclared}"
    for method, path, op in operations:
        assert op["security"] == [{"bearer": [op[REQUIRED_ROLE]]}], f"{method} {path}: {op.get('security')}"
    for path in ("/healthz", "/readyz"):
        assert "security" not in spec["paths"][path]["get"] and REQUIRED_ROLE not in spec["paths"][path]["get"]


def test_every_v1_operation_checks_its_role(client: TestClient, keys: dict[str, str]) -> None:
    checked = 0
    for method, path, op in _operations(client):
        required = op[REQUIRED_ROLE]
        anonymous = _call(client, method, path)
        assert anonymous.status_code == 401, f"{method} {path} without a key: {anonymous.status_code}"
        assert anonymous.headers["www-authenticate"] == "Bearer"
        assert anonymous.headers["content-type"] == "application/problem+json"
        assert "Authorization: Bearer" in anonymous.json()["detail"]
        for role, key in keys.items():
            response = _call(client, method, path, bearer(key))
            if required in GRANTS[role]:  # type: ignore[index]
                assert response.status_code not in (401, 403), f"{method} {path} as {role}: {response.text}"
            else:
                assert response.status_code == 403, f"{method} {path} as {role}: {response.status_code}"
                body = response.json()
                assert body["title"] == "forbidden" and f"--role {required}" in body["detail"]
            checked += 1
    assert checked >= 11 * len(ROLES)


def test_a_bad_or_malformed_key_is_401(client: TestClient, keys: dict[str, str]) -> None:
    for headers in ({"Authorization": "Bearer rsk_not-a-key"}, {"Authorization": "Bearer nothing"},
                    {"Authorization": f"Basic {keys['admin']}"}, {"Authorization": "Bearer"}):
        response = client.get("/v1/documents", headers=headers)
        assert response.status_code == 401, headers
        assert response.headers["www-authenticate"] == "Bearer"
        assert "ragsvc keys create" in response.json()["detail"]


def test_a_revoked_key_is_401(client: TestClient, migrated_url: str) -> None:
    view, key = with_keys(migrated_url, lambda repo: repo.create("reader", name="short-lived"))
    assert client.get("/v1/documents", headers=bearer(key)).status_code == 200
    # Revoked through the server's own repository: refused at once.
    revoked = client.portal.call(client.app.state.runtime.keys.revoke, view.prefix)
    assert revoked.revoked and revoked.id == view.id
    response = client.get("/v1/documents", headers=bearer(key))
    assert response.status_code == 401 and "revoked" in response.json()["detail"]


def test_a_key_revoked_elsewhere_stops_working_within_the_cache_ttl(client: TestClient, migrated_url: str) -> None:
    view, key = with_keys(migrated_url, lambda repo: repo.create("reader"))
    assert client.get("/v1/documents", headers=bearer(key)).status_code == 200
    with_keys(migrated_url, lambda repo: repo.revoke(str(view.id)))
    deadline = time.monotonic() + 7  # the TTL is 5 s
    while client.get("/v1/documents", headers=bearer(key)).status_code == 200:
        assert time.monotonic() < deadline, "a revoked key still works after the cache TTL"
        time.sleep(0.25)


def test_keys_are_stored_hashed(migrated_url: str) -> None:
    view, key = with_keys(migrated_url, lambda repo: repo.create("ingester", principals=["p1"], collections=["kb"]))
    assert re.fullmatch(r"rsk_[A-Za-z0-9_-]{43}", key)
    conninfo = migrated_url.replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(conninfo) as conn:
        rows = conn.execute("SELECT * FROM api_keys").fetchall()
        mine = conn.execute("SELECT prefix, key_hash, role, principals, collections FROM api_keys WHERE id = %s",
                            (view.id,)).fetchone()
    assert all(key not in str(value) for row in rows for value in row)
    assert mine == (key[:12], hashlib.sha256(key.encode()).hexdigest(), "ingester", ["p1"], ["kb"])
    assert view.prefix == key[:12] and not view.revoked


def test_last_used_is_written_at_most_once_a_minute(migrated_url: str) -> None:
    view, key = with_keys(migrated_url, lambda repo: repo.create("reader"))

    async def use_twice(repo: ApiKeyRepository) -> list[Any]:
        seen = []
        for _ in range(2):
            caller = await repo.authenticate(key)
            assert caller is not None and caller.key_id == view.id
            seen.append(next(k.last_used_at for k in await repo.list() if k.id == view.id))
        return seen

    first, second = with_keys(migrated_url, use_twice, ttl_s=0)  # no cache: both reach the database
    assert first is not None and second == first
    conninfo = migrated_url.replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(conninfo) as conn:
        conn.execute("UPDATE api_keys SET last_used_at = now() - interval '2 minutes' WHERE id = %s", (view.id,))
    third, _ = with_keys(migrated_url, use_twice, ttl_s=0)
    assert third > first


def test_list_marks_revoked_keys_and_revoke_is_idempotent(migrated_url: str) -> None:
    view, _ = with_keys(migrated_url, lambda repo: repo.create("reviewer", name="to-revoke"))
    once = with_keys(migrated_url, lambda repo: repo.revoke(view.prefix))
    twice = with_keys(migrated_url, lambda repo: repo.revoke(str(view.id)))
    assert once.revoked_at == twice.revoked_at is not None
    listed = {k.id: k for k in with_keys(migrated_url, lambda repo: repo.list())}
    assert listed[view.id].revoked and listed[view.id].name == "to-revoke"
    assert any(not k.revoked for k in listed.values())


# --- scope ------------------------------------------------------------------------------------

def _search(client: TestClient, key: str, **body: Any):
    return client.post("/v1/search", headers=bearer(key), json={
        "query": "Falcon", "collection": "kb", "strategies": ["keyword"], "rerank": False, "adaptive": False,
        **body})


def _found(response) -> set[str]:
    assert response.status_code == 200, response.text
    return {r["source_uri"] for r in response.json()["results"]}


def test_searches_run_with_the_keys_principals(client: TestClient, keys: dict[str, str],
                                               migrated_url: str) -> None:
    assert _found(_search(client, keys["reader"])) == {"public.md"}
    both = create_key(migrated_url, "reader", principals=["legal", "hr"])
    assert _found(_search(client, both)) == {"public.md", "legal.md", "hr.md"}
    # A request narrows its key's principals ...
    assert _found(_search(client, both, principals=["hr"])) == {"public.md", "hr.md"}
    # ... but never widens them.
    widened = _search(client, both, principals=["hr", "finance"])
    assert widened.status_code == 403 and "finance" in widened.json()["detail"]
    assert "legal" not in widened.json()["detail"].split("holds")[0]
    assert _search(client, keys["reader"], principals=["legal"]).status_code == 403
    assert _search(client, keys["admin"], principals=["legal"]).status_code == 403


def test_questions_run_with_the_keys_principals(client: TestClient, keys: dict[str, str],
                                                migrated_url: str) -> None:
    legal = create_key(migrated_url, "reader", principals=["legal"])
    question = {"question": "Which company will Project Falcon acquire next quarter?", "collection": "kb"}
    answer = client.post("/v1/query", headers=bearer(legal), json=question)
    assert answer.status_code == 200, answer.text
    assert "legal.md" in {c["source_uri"] for c in answer.json()["citations"]}
    public = client.post("/v1/query", headers=bearer(keys["reader"]), json=question).json()
    assert "legal.md" not in {c["source_uri"] for c in public["citations"]}
    for path in ("/v1/query", "/v1/query/stream"):
        widened = client.post(path, headers=bearer(legal), json={**question, "principals": ["hr"]})
        assert widened.status_code == 403 and "hr" in widened.json()["detail"], path


def test_documents_outside_the_keys_acl_are_not_found(client: TestClient, keys: dict[str, str],
                                                     migrated_url: str) -> None:
    legal = create_key(migrated_url, "reader", principals=["legal"])
    listed = client.get("/v1/documents", params={"collection": "kb"}, headers=bearer(legal)).json()
    legal_doc = next(d["id"] for d in listed["data"] if d["source_uri"] == "legal.md")
    assert client.get(f"/v1/documents/{legal_doc}", headers=bearer(legal)).status_code == 200
    assert client.get(f"/v1/documents/{legal_doc}", headers=bearer(keys["reader"])).status_code == 404
    # The listing shows a key only what it may read, and counts only that.
    public = client.get("/v1/documents", params={"collection": "kb"}, headers=bearer(keys["reader"])).json()
    assert "legal.md" not in {d["source_uri"] for d in public["data"]} and public["count"] < listed["count"]
    ingester = create_key(migrated_url, "ingester", collections=["kb"])
    assert client.delete(f"/v1/documents/{legal_doc}", headers=bearer(ingester)).status_code == 404


def test_a_key_limited_to_collections_stays_in_them(client: TestClient, keys: dict[str, str],
                                                    migrated_url: str) -> None:
    kb_reader = create_key(migrated_url, "reader", collections=["kb"])
    kb_ingester = create_key(migrated_url, "ingester", collections=["kb"])
    assert _found(_search(client, kb_reader)) == {"public.md"}
    outside = _search(client, kb_reader, collection="other")
    assert outside.status_code == 403 and "'other'" in outside.json()["detail"]
    question = client.post("/v1/query", headers=bearer(kb_reader), json={"question": "Falcon?", "collection": "other"})
    assert question.status_code == 403
    # Listing without a collection lists the key's one collection.
    listed = client.get("/v1/documents", headers=bearer(kb_reader)).json()
    # the key holds no principals: of kb's three documents it lists the public one
    assert listed["count"] == 1 and {d["collection"] for d in listed["data"]} == {"kb"}
    assert client.get("/v1/documents", params={"collection": "other"}, headers=bearer(kb_reader)).status_code == 403
    everything = client.get("/v1/documents", headers=bearer(keys["reader"])).json()
    other_doc = next(d["id"] for d in everything["data"] if d["collection"] == "other")
    assert client.get(f"/v1/documents/{other_doc}", headers=bearer(kb_reader)).status_code == 403
    assert client.delete(f"/v1/documents/{other_doc}", headers=bearer(kb_ingester)).status_code == 403
    ingest = client.post("/v1/documents", headers=bearer(kb_ingester),
                         json={"source_uri": "x.md", "collection": "other", "text": "x"})
    assert ingest.status_code == 403
    jobs = client.get("/v1/jobs", headers=bearer(kb_reader)).json()
    assert jobs["data"] and {j["collection"] for j in jobs["data"]} == {"kb"}
    other_job = next(j["id"] for j in client.get("/v1/jobs", headers=bearer(keys["reader"])).json()["data"]
                     if j["collection"] == "other")
    assert client.get(f"/v1/jobs/{other_job}", headers=bearer(kb_reader)).status_code == 403


def test_guideline_versions_record_the_admin_key(client: TestClient, keys: dict[str, str],
                                                 migrated_url: str) -> None:
    current = client.get("/v1/guidelines", headers=bearer(keys["reader"])).json()
    stored = client.put("/v1/guidelines", headers=bearer(keys["admin"]),
                        json={"guidelines": current["guidelines"], "comment": "by key"})
    assert stored.status_code == 200, stored.text
    conninfo = migrated_url.replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(conninfo) as conn:
        author, = conn.execute("SELECT author FROM prompt_versions WHERE kind = 'guidelines' AND version = %s",
                               (stored.json()["version"],)).fetchone()
    assert author.startswith("admin-key (")


# --- without keys ----------------------------------------------------------------------------

def test_without_keys_a_loopback_server_runs_requests_as_the_local_admin(
        databases, caplog: pytest.LogCaptureFixture) -> None:
    url = databases.create()
    api_auth._announce_local_admin.cache_clear()
    with caplog.at_level(logging.WARNING, logger="rag_service.api.auth"), \
            TestClient(create_app(load_settings(database_url=url))) as client:
        assert client.get("/v1/documents").status_code == 200
        current = client.get("/v1/guidelines").json()
        assert client.put("/v1/guidelines", json={"guidelines": current["guidelines"]}).status_code == 200
        # A key that is sent must be valid, keys or not.
        assert client.get("/v1/documents", headers=bearer("rsk_unknown")).status_code == 401
        # Once a key exists (here created by this process), requests need one.
        _, key = client.portal.call(client.app.state.runtime.keys.create, "reader")
        assert client.get("/v1/documents").status_code == 401
        assert client.get("/v1/documents", headers=bearer(key)).status_code == 200
    announcements = [r for r in caplog.records if "local admin" in r.getMessage()]
    assert len(announcements) == 1


def test_without_keys_a_non_loopback_server_refuses_every_request(databases) -> None:
    url = databases.create()
    with TestClient(create_app(load_settings(database_url=url, host="0.0.0.0"))) as client:  # noqa: S104
        response = client.get("/v1/documents")
        assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
        assert "ragsvc keys create --role reader" in response.json()["detail"]
        assert client.get("/healthz").status_code == 200


def test_serve_refuses_a_non_loopback_address_without_keys() -> None:
    with pytest.raises(ConfigError, match="ragsvc keys create"):
        check_exposure("0.0.0.0", any_active_key=False)  # noqa: S104
    check_exposure("0.0.0.0", any_active_key=True)  # noqa: S104
    check_exposure("127.0.0.1", any_active_key=False)


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.0.0.2", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("LOCALHOST", True), ("0.0.0.0", False), ("::", False), ("192.168.1.20", False), ("example.com", False),
])
def test_loopback_addresses(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


# --- the scoping rules, pure --------------------------------------------------------------------

KEY = Caller(key_id=uuid.uuid4(), role="reader", principals=("legal", "hr"), collections=("kb",))


def test_principals_narrow_but_never_widen() -> None:
    assert scope_principals(KEY, []) == ["legal", "hr"]
    assert scope_principals(KEY, ["hr", "hr"]) == ["hr"]
    with pytest.raises(ForbiddenError, match="finance"):
        scope_principals(KEY, ["hr", "finance"])
    public_only = Caller(key_id=uuid.uuid4(), role="admin", principals=())
    assert scope_principals(public_only, []) == []
    with pytest.raises(ForbiddenError, match=r"public documents only"):
        scope_principals(public_only, ["legal"])
    # The local admin searches as whoever the request names, as before keys existed.
    assert scope_principals(LOCAL_ADMIN, []) == []
    assert scope_principals(LOCAL_ADMIN, ["anyone"]) == ["anyone"]


def test_collections_scope() -> None:
    assert scoped_collection(KEY, "kb") == "kb"
    assert scoped_collection(LOCAL_ADMIN, "anything") == "anything"
    with pytest.raises(ForbiddenError, match="'other'"):
        scoped_collection(KEY, "other")
    request = scoped(KEY, SearchRequest(query="x", collection="kb", principals=["legal"]))
    assert request.principals == ["legal"] and request.collection == "kb"
    # Another tenant's key reads the same name as its own collection's key.
    acme = KEY.model_copy(update={"tenant": "acme"})
    assert scoped_collection(acme, "kb") == "acme/kb"
    assert scoped(acme, QueryRequest(question="x", collection="kb")).collection == "acme/kb"
    assert scoped(KEY, QueryRequest(question="x", collection="kb")).principals == ["legal", "hr"]
    with pytest.raises(ForbiddenError):
        scoped(KEY, QueryRequest(question="x", collection="other"))


def test_grants() -> None:
    assert KEY.can("reader") and not KEY.can("ingester")
    assert Caller(role="ingester").can("reader") and not Caller(role="ingester").can("reviewer")
    assert Caller(role="reviewer").can("reader") and not Caller(role="reviewer").can("admin")
    assert all(LOCAL_ADMIN.can(r) for r in ROLES) and LOCAL_ADMIN.label == "local admin"


def test_a_proxied_request_is_never_the_local_admin(migrated_url: str) -> None:
    from fastapi.testclient import TestClient

    from rag_service.api import create_app
    from rag_service.config import load_settings

    with TestClient(create_app(load_settings(database_url=migrated_url, serve_worker="off"))) as client:
        headers = {"X-Forwarded-For": "203.0.113.7"}
        assert client.get("/v1/guidelines", headers=headers).status_code == 401
