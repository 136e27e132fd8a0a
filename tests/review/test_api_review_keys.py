"""The review and answer routes with API keys: claims and decisions belong to the key that made
them, roles and collection scopes hold, readers see only their own answers, and ``ragsvc review``
acts as a key with --key."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from rag_service.api import create_app
from rag_service.cli import app as cli
from rag_service.config import load_settings
from rag_service.db.repos.keys import ApiKeyRepository
from tests.review.conftest import DbRun
from tests.review.seed import seed

COLLECTION, OTHER = "kb-keys", "kb-other"


@pytest.fixture(scope="module")
def keys(db_run: DbRun) -> dict[str, tuple[uuid.UUID, str]]:
    async def make(db: Any) -> dict[str, tuple[uuid.UUID, str]]:
        repo = ApiKeyRepository(db)
        made = {}
        for name, role, collections in (("alice", "reviewer", ()), ("bob", "reviewer", ()),
                                        ("scoped", "reviewer", (OTHER,)), ("reader", "reader", ()),
                                        ("reader2", "reader", ())):
            view, key = await repo.create(role, (), collections, name)
            made[name] = (view.id, key)
        return made

    return db_run(make)


@pytest.fixture(scope="module")
def client(migrated_url: str, keys: dict) -> Iterator[TestClient]:
    with TestClient(create_app(load_settings(database_url=migrated_url))) as test_client:
        yield test_client


def auth(keys: dict, name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {keys[name][1]}"}


def test_claims_and_decisions_belong_to_the_key(client: TestClient, keys: dict, db_run: DbRun) -> None:
    _, review_id = seed(db_run, collection=COLLECTION)
    alice, bob = auth(keys, "alice"), auth(keys, "bob")
    claim = client.post(f"/v1/reviews/{review_id}/claim", headers=alice)
    assert claim.status_code == 200 and claim.json()["claimed_by"] == str(keys["alice"][0])
    taken = client.post(f"/v1/reviews/{review_id}/claim", headers=bob)
    assert taken.status_code == 409 and taken.json()["claimed_by"] == str(keys["alice"][0])
    approve = {"decision": "approved", "category": "other"}
    assert client.post(f"/v1/reviews/{review_id}/decision", json=approve, headers=bob).status_code == 409
    decided = client.post(f"/v1/reviews/{review_id}/decision", json=approve, headers=alice)
    assert decided.status_code == 201 and decided.json()["reviewer_key_id"] == str(keys["alice"][0])


def test_roles_and_scopes(client: TestClient, keys: dict, db_run: DbRun) -> None:
    _, review_id = seed(db_run, collection=COLLECTION)
    assert client.get("/v1/reviews").status_code == 401  # keys exist: no more keyless access
    assert client.get("/v1/reviews", headers=auth(keys, "reader")).status_code == 403
    assert client.get("/v1/reviews/stats", headers=auth(keys, "reader")).status_code == 403
    scoped = auth(keys, "scoped")
    assert client.get(f"/v1/reviews/{review_id}", headers=scoped).status_code == 404
    assert client.post(f"/v1/reviews/{review_id}/claim", headers=scoped).status_code == 404
    assert client.get("/v1/reviews", params={"collection": COLLECTION}, headers=scoped).status_code == 403
    listed = client.get("/v1/reviews", headers=scoped).json()
    assert all(item["collection"] == OTHER for item in listed["data"])
    assert str(review_id) in {i["id"] for i in client.get("/v1/reviews", headers=auth(keys, "bob")).json()["data"]}


def test_readers_see_and_rate_only_their_own_answers(client: TestClient, keys: dict,
                                                     db_run: DbRun) -> None:
    mine, _ = seed(db_run, collection=COLLECTION, queue=False, api_key_id=keys["reader"][0])
    reader, other = auth(keys, "reader"), auth(keys, "reader2")
    assert client.get(f"/v1/answers/{mine}", headers=reader).json()["status"] == "answered"
    assert client.get(f"/v1/answers/{mine}", headers=other).status_code == 404
    assert client.post(f"/v1/answers/{mine}/feedback", json={"rating": 1}, headers=other).status_code == 404
    assert client.post(f"/v1/answers/{mine}/feedback", json={"rating": 1}, headers=reader).status_code == 201
    assert client.get(f"/v1/answers/{mine}", headers=auth(keys, "bob")).status_code == 200  # reviewers see all


def test_the_cli_acts_as_a_key(migrated_url: str, keys: dict, db_run: DbRun,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGSVC_DATABASE_URL", migrated_url)
    _, review_id = seed(db_run, collection=COLLECTION)
    runner = CliRunner()
    as_alice = ["--key", keys["alice"][1], "--json"]
    result = runner.invoke(cli, ["review", "claim", str(review_id), *as_alice])
    assert result.exit_code == 0, result.output
    assert '"claimed_by": "' + str(keys["alice"][0]) in result.stdout
    denied = runner.invoke(cli, ["review", "list", "--key", keys["reader"][1]])
    assert denied.exit_code == 2 and "reviewer" in denied.output
    unknown = runner.invoke(cli, ["review", "list", "--key", "rsk_nope"])
    assert unknown.exit_code == 2 and "unknown or revoked" in unknown.output
    # The local operator is someone else: the claim stands against it.
    conflict = runner.invoke(cli, ["review", "decide", str(review_id), "--decision", "approved", "--category", "other"])
    assert conflict.exit_code == 6 and "claimed by reviewer key" in " ".join(conflict.output.split())
    done = runner.invoke(cli, ["review", "decide", str(review_id), "--decision", "approved", "--category", "other",
                               *as_alice])
    assert done.exit_code == 0, done.output
