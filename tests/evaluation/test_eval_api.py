"""/v1/eval-runs over HTTP with API keys: an admin queues runs that the server's worker executes;
reviewers follow them, read item results, compare two runs and open a run's report; bad input is a
4xx that says what to fix."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from rag_service.api import create_app
from rag_service.config import load_settings
from tests.evaluation.test_runner import QUERIES, beir_dir
from tests.test_auth import bearer, create_key


@pytest.fixture(scope="module")
def keys(migrated_url: str) -> dict[str, str]:
    return {role: create_key(migrated_url, role, name=f"{role}-eval") for role in ("admin", "reviewer")}


@pytest.fixture(scope="module")
def client(migrated_url: str):
    settings = load_settings(database_url=migrated_url, serve_worker="on", worker_heartbeat_s=1)
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def _finished(client: TestClient, location: str, headers: dict[str, str]) -> dict:
    deadline = time.monotonic() + 300
    while (run := client.get(location, headers=headers).json())["status"] not in ("finished", "failed"):
        assert time.monotonic() < deadline, run
        time.sleep(0.3)
    return run


def test_runs_are_queued_run_by_the_worker_and_read_compared_and_reported(
        client: TestClient, keys: dict[str, str], tmp_path: Path) -> None:
    admin, reviewer = bearer(keys["admin"]), bearer(keys["reviewer"])
    body = {"dataset": f"beir:{beir_dir(tmp_path / 'beir')}", "name": "api-a"}
    assert client.post("/v1/eval-runs", json=body, headers=reviewer).status_code == 403

    accepted = client.post("/v1/eval-runs", json=body, headers=admin)
    assert accepted.status_code == 202, accepted.text
    assert accepted.json()["status"] == "queued" and accepted.json()["items_total"] == len(QUERIES)
    first = _finished(client, accepted.headers["Location"], reviewer)
    assert first["status"] == "finished" and first["items_done"] == len(QUERIES), first
    assert first["summary"]["metrics"]["ndcg@10"]["mean"] >= 0.8

    second = _finished(client, client.post("/v1/eval-runs", json={**body, "name": "api-b"},
                                           headers=admin).headers["Location"], reviewer)
    listed = client.get("/v1/eval-runs?limit=1", headers=reviewer).json()
    assert listed["count"] == 2 and [r["id"] for r in listed["data"]] == [second["id"]]

    page = client.get(f"/v1/eval-runs/{first['id']}/results?limit=2&offset=1", headers=reviewer).json()
    assert page["count"] == len(QUERIES) and [r["item_id"] for r in page["data"]] == list(QUERIES)[1:3]

    compared = client.get(f"/v1/eval-runs/{second['id']}/compare?against=api-a", headers=reviewer)
    assert compared.status_code == 200, compared.text
    ndcg = next(m for m in compared.json()["metrics"] if m["metric"] == "ndcg@10")
    assert ndcg["n"] == len(QUERIES) and ndcg["difference"] == 0

    report = client.get(f"/v1/eval-runs/{second['id']}/report?against=api-a", headers=reviewer)
    assert report.status_code == 200 and report.headers["content-type"].startswith("text/html")
    assert report.text.count("data:image/png;base64,") >= 2


def test_bad_requests_say_what_to_fix(client: TestClient, keys: dict[str, str], tmp_path: Path) -> None:
    admin = bearer(keys["admin"])
    wrong_mode = client.post("/v1/eval-runs", json={"dataset": "golden", "mode": "fast"}, headers=admin)
    assert wrong_mode.status_code == 422 and "mode" in wrong_mode.text

    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"question": "fine?", "answers": ["yes"]}\n{"question": 3, "answers": ["no"]}\n')
    malformed = client.post("/v1/eval-runs", json={"dataset": f"qa:{broken}"}, headers=admin)
    assert malformed.status_code == 422
    assert "broken.jsonl" in malformed.text and "line 2" in malformed.text and "question" in malformed.text

    missing = client.post("/v1/eval-runs", json={"dataset": f"beir:{tmp_path / 'nowhere'}"}, headers=admin)
    assert missing.status_code == 422 and "nowhere" in missing.text

    unknown = client.get("/v1/eval-runs/00000000-0000-0000-0000-000000000000", headers=admin)
    assert unknown.status_code == 404
    other = client.get("/v1/eval-runs/00000000-0000-0000-0000-000000000000/compare?against=nope", headers=admin)
    assert other.status_code == 404 and "nope" in other.text


def test_the_console_lists_runs_and_links_their_reports(client: TestClient, keys: dict[str, str]) -> None:
    client.cookies.clear()
    assert client.post("/review/login", data={"api_key": keys["reviewer"]}).status_code in (200, 303)
    page = client.get("/review/eval-runs")
    assert page.status_code == 200 and "api-a" in page.text and "api-b" in page.text, page.text[:500]
    links = re.findall(r'href="(/review/eval-runs/[^"]+/report[^"]*)"', page.text)
    against = [link for link in links if "against=" in link]
    assert len(links) >= 3 and against  # each run's report, and the newer one against the older
    report = client.get(against[0].replace("&amp;", "&"))
    assert report.status_code == 200 and report.text.count("data:image/png;base64,") >= 2
    client.cookies.clear()


def test_put_guidelines_is_refused_while_the_offline_gate_is_required(migrated_url: str,
                                                                      keys: dict[str, str]) -> None:
    settings = load_settings(database_url=migrated_url, serve_worker="off", promotion_requires_eval_run=True)
    with TestClient(create_app(settings)) as gated:
        admin = bearer(keys["admin"])
        current = gated.get("/v1/guidelines", headers=admin).json()
        refused = gated.put("/v1/guidelines", json={"guidelines": current["guidelines"]}, headers=admin)
        assert refused.status_code == 409 and "RAGSVC_PROMOTION_REQUIRES_EVAL_RUN" in refused.text
        assert gated.get("/v1/guidelines", headers=admin).json()["version"] == current["version"]
