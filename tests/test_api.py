"""The HTTP skeleton in-process: health, readiness (and its 503 reasons), OpenAPI, error bodies."""

from __future__ import annotations

import gc
import time

from fastapi.testclient import TestClient

from rag_service.api import create_app
from rag_service.config import load_settings


def _wait_ready(client: TestClient, timeout_s: float = 60) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        response = client.get("/readyz")
        if response.status_code == 200 or time.monotonic() > deadline:
            return response
        time.sleep(0.1)


def test_ready_on_a_migrated_database(migrated_url: str) -> None:
    with TestClient(create_app(load_settings(database_url=migrated_url))) as client:
        assert client.get("/healthz").json() == {"status": "ok"}
        response = _wait_ready(client)
        assert response.status_code == 200, response.text
        assert response.json() == {"ready": True, "checks": {"database": "ok", "embedder": "ok"}}


def test_start_up_objects_are_frozen_while_serving(migrated_url: str) -> None:
    # gc.freeze after the models load keeps full collections from walking start-up's objects;
    # shutting down gives them back, so a process that serves again starts clean.
    assert gc.get_freeze_count() == 0
    with TestClient(create_app(load_settings(database_url=migrated_url))) as client:
        assert _wait_ready(client).status_code == 200
        deadline = time.monotonic() + 30
        while gc.get_freeze_count() == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gc.get_freeze_count() > 10_000
    assert gc.get_freeze_count() == 0


def test_not_ready_says_why(databases) -> None:
    url = databases.create(migrated=False)
    with TestClient(create_app(load_settings(database_url=url))) as client:
        response = _wait_ready(client, timeout_s=5)
        assert response.status_code == 503
        body = response.json()
        assert body["ready"] is False
        assert "ragsvc db upgrade" in body["checks"]["database"]


def test_openapi_documents_the_routes(migrated_url: str) -> None:
    with TestClient(create_app(load_settings(database_url=migrated_url))) as client:
        spec = client.get("/openapi.json").json()
        assert {"/healthz", "/readyz"} <= set(spec["paths"])
        assert "503" in spec["paths"]["/readyz"]["get"]["responses"]
        assert client.get("/docs").status_code == 200


def test_errors_are_problem_bodies(migrated_url: str) -> None:
    with TestClient(create_app(load_settings(database_url=migrated_url))) as client:
        response = client.get("/v1/nope")
        assert response.status_code == 404
        assert response.headers["content-type"] == "application/problem+json"
        assert response.json() == {"title": "not found", "status": 404, "detail": "Not Found"}
        assert client.post("/healthz").json()["status"] == 405


def test_problem_bodies_name_the_failed_step_and_hide_bugs() -> None:
    from rag_service.api.problems import problem_body
    from rag_service.errors import DatabaseUnavailableError

    error = DatabaseUnavailableError("cannot reach PostgreSQL")
    error.step = "retrieve-2"
    assert problem_body(error) == {"title": "database unavailable", "status": 503,
                                   "detail": "cannot reach PostgreSQL", "step": "retrieve-2"}
    assert "step" not in problem_body(DatabaseUnavailableError("down"))
    hidden = problem_body(KeyError("secret"))
    assert hidden["status"] == 500 and "secret" not in hidden["detail"]
