"""POST /v1/evaluate and `ragsvc evaluate`: answers from elsewhere, graded by the same scorers."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from rag_service.api import create_app
from rag_service.cli import app as cli
from rag_service.config import get_settings, load_settings
from rag_service.domain import METRICS

CONTEXT = "The refund window is 30 days from delivery. Refunds are paid to the original card."


@pytest.fixture(scope="module")
def client(migrated_url: str):
    with TestClient(create_app(load_settings(database_url=migrated_url, serve_worker="off"))) as test_client:
        yield test_client


def grade(client: TestClient, answer: str, **extra: object) -> dict:
    response = client.post("/v1/evaluate", json={"question": "How long is the refund window?", "answer": answer,
                                                 "contexts": [CONTEXT], **extra})
    assert response.status_code == 200, response.text
    return response.json()


def test_the_shape_and_a_right_answer_above_a_wrong_one(client: TestClient) -> None:
    right = grade(client, "The refund window is 30 days from delivery [1].")
    wrong = grade(client, "The refund window is 90 days from delivery [1].")
    assert set(right) == {"overall", "metrics", "needs_review", "reasons"} and set(right["metrics"]) == set(METRICS)
    assert right["metrics"]["faithfulness"]["scorer"] == "local-v1"
    assert right["overall"] > wrong["overall"] and not right["needs_review"] and wrong["needs_review"]
    assert wrong["metrics"]["correctness"]["value"] < right["metrics"]["correctness"]["value"]
    assert any(r.startswith("correctness:") for r in wrong["reasons"])


def test_reference_and_dated_contexts(client: TestClient) -> None:
    graded = grade(client, "It is 30 days [1].", reference="30 days",
                   contexts=[{"text": CONTEXT, "effective_date": "2020-01-01"}])
    assert graded["metrics"]["correctness"]["value"] == 1.0
    assert graded["metrics"]["freshness"]["value"] < 0.25


def test_bad_input_says_what_to_fix(client: TestClient) -> None:
    response = client.post("/v1/evaluate", json={"question": "q", "answer": "", "contexts": []})
    assert response.status_code == 422 and response.json()["detail"][0]["field"].endswith("answer")
    too_long = client.post("/v1/evaluate", json={"question": "q", "answer": "a", "contexts": ["x" * 20_001]})
    assert too_long.status_code == 422 and "not the whole document" in json.dumps(too_long.json())


def test_cli_evaluate(migrated_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGSVC_DATABASE_URL", migrated_url)
    get_settings.cache_clear()
    result = CliRunner().invoke(cli, ["evaluate", "-q", "How long is the refund window?", "-a",
                                      "The refund window is 30 days [1].", "--context", CONTEXT, "--json"])
    assert result.exit_code == 0, result.output
    graded = json.loads(result.stdout.strip().splitlines()[-1])
    assert graded["metrics"]["faithfulness"]["value"] == 1.0
    missing = CliRunner().invoke(cli, ["evaluate", "--json"])
    assert missing.exit_code == 2
