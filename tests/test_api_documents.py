"""Documents and jobs over HTTP, with the in-process worker running the jobs for real."""

from __future__ import annotations

import time
import uuid

import pytest
from fastapi.testclient import TestClient

from rag_service.api import create_app
from rag_service.config import load_settings
from tests.ingestion.files import make_pdf


@pytest.fixture(scope="module")
def client(migrated_url: str):
    settings = load_settings(database_url=migrated_url, serve_worker="on", worker_heartbeat_s=1,
                             ingest_max_file_bytes=200_000, chunk_size=64, chunk_overlap=8)
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def _wait_job(client: TestClient, url: str, timeout_s: float = 120) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = client.get(url).json()
        if job["status"] in ("succeeded", "failed"):
            return job
        time.sleep(0.2)
    raise AssertionError(f"job did not finish: {job}")


def test_upload_files_runs_a_job_and_reports_per_file(client: TestClient) -> None:
    files = [
        ("files", ("guide.md", b"# Guide\n\nThe capybara is the largest rodent. Error E-77 is rare.", "text/markdown")),
        ("files", ("notes.txt", b"Walruses have tusks.", "text/plain")),
        ("files", ("manual.pdf", make_pdf(["Okapi facts on page one."]), "application/pdf")),
        ("files", ("bad.xyz", b"whatever", "application/octet-stream")),
        ("files", ("empty.txt", b"", "text/plain")),
    ]
    response = client.post("/v1/documents", files=files, data={"collection": "api", "tags": "zoo, animals"})
    assert response.status_code == 202, response.text
    body = response.json()
    assert response.headers["location"] == body["status_url"] == f"/v1/jobs/{body['job_id']}"
    job = _wait_job(client, body["status_url"])
    assert job["status"] == "succeeded", job
    report = job["report"]
    assert report["documents"] == {"added": 3, "updated": 0, "unchanged": 0, "deleted": 0, "failed": 2}
    assert {e["source"] for e in report["errors"]} == {"bad.xyz", "empty.txt"}
    assert report["chunks"]["embedded"] >= 3
    assert job["progress"]["documents_done"] == 3

    listing = client.get("/v1/documents", params={"collection": "api"}).json()
    assert listing["count"] == 3
    guide = next(d for d in listing["data"] if d["source_uri"] == "guide.md")
    assert guide["tags"] == ["zoo", "animals"] and guide["metadata"]["identifiers"] == ["E-77"]
    detail = client.get(f"/v1/documents/{guide['id']}").json()
    assert detail["chunks"] and detail["chunks"][0]["text"].startswith("# Guide")
    assert detail["chunks"][0]["start_char"] == 0

    assert client.delete(f"/v1/documents/{guide['id']}").status_code == 204
    assert client.get(f"/v1/documents/{guide['id']}").status_code == 404
    assert client.delete(f"/v1/documents/{guide['id']}").json()["status"] == 404


def test_json_documents_and_reingest(client: TestClient) -> None:
    doc = {"source_uri": "kb/faq.md", "text": "# FAQ\n\nNarwhals live in the Arctic.", "title": "FAQ",
           "metadata": {"owner": "ops"}, "collection": "json-api"}
    first = _wait_job(client, client.post("/v1/documents", json=doc).json()["status_url"])
    assert first["report"]["documents"]["added"] == 1
    again = _wait_job(client, client.post("/v1/documents", json=[doc]).json()["status_url"])
    assert again["report"]["documents"]["unchanged"] == 1
    listing = client.get("/v1/documents", params={"collection": "json-api"}).json()
    assert listing["data"][0]["title"] == "FAQ" and listing["data"][0]["metadata"]["owner"] == "ops"
    jobs = client.get("/v1/jobs", params={"limit": 2}).json()
    assert jobs["count"] >= 2 and len(jobs["data"]) == 2


@pytest.mark.parametrize("kwargs, status, fragment", [
    (dict(content=b"hello", headers={"content-type": "text/plain"}), 422, "multipart/form-data"),
    (dict(json={"source_uri": "x"}), 422, "text"),
    (dict(json={"source_uri": "x", "text": "y", "collection": "bad name!"}), 422, "collection"),
    (dict(json=[]), 422, "at least one"),
    (dict(content=b"{not json", headers={"content-type": "application/json"}), 422, "invalid document JSON"),
    (dict(data={"collection": "c"}, files=[("other", ("a.txt", b"x", "text/plain"))]), 422, "'files'"),
    (dict(files=[("files", ("big.txt", b"x" * 200_001, "text/plain"))]), 413, "limit"),
    (dict(files=[("files", ("a.txt", b"x", "text/plain")), ("files", ("a.txt", b"y", "text/plain"))]), 422,
     "repeated"),
])
def test_malformed_requests_say_what_to_fix(client: TestClient, kwargs, status, fragment) -> None:
    response = client.post("/v1/documents", **kwargs)
    assert response.status_code == status, response.text
    assert fragment in str(response.json()["detail"])


def test_nul_characters_in_json_are_dropped(client: TestClient) -> None:
    doc = {"source_uri": "nul\u0000.txt", "text": "bytes\u0000here", "title": "t\u0000",
           "metadata": {"k": "v\u0000"}, "collection": "nul"}
    response = client.post("/v1/documents", json=doc)
    assert response.status_code == 202, response.text
    job = _wait_job(client, response.json()["status_url"])
    assert job["status"] == "succeeded" and job["report"]["documents"]["added"] == 1
    [stored] = client.get("/v1/documents", params={"collection": "nul"}).json()["data"]
    assert stored["source_uri"] == "nul.txt" and stored["title"] == "t"


def test_path_and_query_validation(client: TestClient) -> None:
    assert client.get("/v1/jobs/not-a-uuid").status_code == 422
    assert client.get(f"/v1/jobs/{uuid.uuid4()}").status_code == 404
    assert client.get("/v1/documents", params={"limit": 0}).status_code == 422
    assert client.get("/v1/documents", params={"collection": "no spaces"}).status_code == 422


def test_openapi_describes_both_upload_forms(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    content = spec["paths"]["/v1/documents"]["post"]["requestBody"]["content"]
    assert {"multipart/form-data", "application/json"} <= set(content)
    assert "DocumentCreate" in spec["components"]["schemas"]
    assert {"/v1/jobs/{job_id}", "/v1/documents/{document_id}"} <= set(spec["paths"])
