"""GET /metrics: the series after real queries through the app (real PostgreSQL, the local model),
the monitor role, and the quality alert's rule."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from rag_service.observability.metrics import ALERT_RUN, QualityAlert
from tests.apps import client_with_documents
from tests.test_auth import bearer, create_key


def test_the_quality_alert_starts_after_ten_low_answers_in_a_row_and_ends_on_a_good_one() -> None:
    alert = QualityAlert()
    started = [alert.observe("kb", 0.5) for _ in range(ALERT_RUN)]
    assert started == [False] * (ALERT_RUN - 1) + [True] and alert.active == {"kb"}
    assert alert.observe("kb", 0.6) is False and alert.active == {"kb"}  # still on: started once
    assert alert.observe("other", 0.1) is False and "other" not in alert.active  # per collection
    assert alert.observe("kb", 0.9) is False and alert.active == set()
    assert [alert.observe("kb", 0.69) for _ in range(ALERT_RUN - 1)] == [False] * (ALERT_RUN - 1)  # 9 since 0.9


def _series(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            found = dict(re.findall(r'(\w+)="([^"]*)"', line.rsplit(" ", 1)[0]))
            if all(found.get(k) == v for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
    counts = "\n".join(line for line in text.splitlines() if name in line and "_bucket" not in line)
    raise AssertionError(f"no series {name} {labels}; those there:\n{counts}")


@pytest.fixture(scope="module")
def client(migrated_url: str) -> Iterator[TestClient]:
    yield from client_with_documents(migrated_url)


def test_metrics_after_queries_have_the_series(client: TestClient) -> None:
    for question in ("Why are there tides?", "How long should dough rise?", "What raises the tides?"):
        assert client.post("/v1/query", json={"question": question, "collection": "kb"}).status_code == 200
    assert client.get("/v1/documents/00000000-0000-0000-0000-000000000000").status_code == 404
    client.request("BREW", "/v1/query")  # any method token is accepted on the wire; one series for them all
    scraped = client.get("/metrics")
    assert scraped.status_code == 200 and scraped.headers["content-type"].startswith("text/plain")
    text = scraped.text
    assert _series(text, "ragsvc_http_request_duration_seconds_count", method="POST", route="/v1/query",
                   status="200") == 3
    # The route template, not the raw path: one series for every document id.
    assert _series(text, "ragsvc_http_request_duration_seconds_count", route="/v1/documents/{document_id}",
                   status="404") == 1
    assert _series(text, "ragsvc_queries_total", outcome="answered") >= 2
    assert _series(text, "ragsvc_query_step_duration_seconds_count", step="generate") >= 2
    assert _series(text, "ragsvc_query_step_duration_seconds_count", step="retrieve") >= 2  # not retrieve-1
    assert _series(text, "ragsvc_http_request_duration_seconds_count", method="other") == 1
    assert _series(text, "ragsvc_database_up") == 1
    assert _series(text, "ragsvc_evaluation_score_count", metric="faithfulness") >= 2
    assert _series(text, "ragsvc_evaluation_score_count", metric="overall") >= 2
    assert _series(text, "ragsvc_quality_alert", collection="kb") == 0
    assert _series(text, "ragsvc_ingestion_jobs", status="succeeded") >= 1
    assert _series(text, "ragsvc_ingestion_jobs", status="queued") == 0
    assert _series(text, "ragsvc_review_items", status="pending") >= 0
    assert _series(text, "ragsvc_review_open_age_seconds", quantile="p95") >= 0


def test_only_monitor_keys_and_admins_scrape(client: TestClient, migrated_url: str) -> None:
    monitor, reader = create_key(migrated_url, "monitor", name="scraper"), create_key(migrated_url, "reader")
    assert client.get("/metrics", headers=bearer(monitor)).status_code == 200
    assert client.get("/metrics", headers=bearer(reader)).status_code == 403
    # A monitor key reads nothing else.
    assert client.post("/v1/query", json={"question": "tides?", "collection": "kb"},
                       headers=bearer(monitor)).status_code == 403
