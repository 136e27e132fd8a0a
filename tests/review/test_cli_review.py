"""``ragsvc review`` as the local operator: list, show, claim (by id and the next one), decide,
stats and expire, in JSON and as tables."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from rag_service.cli import app as cli
from tests.review.conftest import DbRun
from tests.review.seed import seed


@pytest.fixture
def ragsvc(migrated_url: str, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    monkeypatch.setenv("RAGSVC_DATABASE_URL", migrated_url)
    runner = CliRunner()

    def run(*args: str, code: int = 0) -> str:
        result = runner.invoke(cli, ["review", *args])
        assert result.exit_code == code, result.output
        return result.stdout if code == 0 else " ".join(result.output.split())

    return run


def test_the_review_workflow_from_the_terminal(ragsvc, db_run: DbRun) -> None:  # noqa: ANN001
    _, normal = seed(db_run, collection="cli", overall=0.7, flagged=["relevance"])
    _, urgent = seed(db_run, collection="cli", overall=0.2, tier="high")

    listed = json.loads(ragsvc("list", "--collection", "cli", "--json"))
    assert listed["count"] == 2 and [i["id"] for i in listed["data"]] == [str(urgent), str(normal)]
    assert [i["id"] for i in json.loads(ragsvc("list", "--metric", "relevance", "--json"))["data"]] == [str(normal)]
    assert "2 of 2 review items" in " ".join(ragsvc("list", "--collection", "cli").split())
    assert "status: Input should be 'pending'" in ragsvc("list", "--status", "lost", code=2)

    claim = json.loads(ragsvc("claim", "--json"))["claim"]  # the next item: the urgent one
    assert claim["review_id"] == str(urgent) and claim["claimed_by"] is None
    assert "corrected_answer is required" in ragsvc("decide", str(urgent), "--decision", "edited", "--category",
                                                    "answer_quality", code=2)
    assert "claim review item" in ragsvc("decide", str(normal), "--decision", "approved", "--category", "other",
                                         code=6)
    decided = json.loads(ragsvc("decide", str(urgent), "--decision", "edited", "--category", "answer_quality",
                                "--corrected-answer", "Better.", "--feedback", "missed the point", "--json"))
    assert decided["decision"] == "edited" and decided["golden_item_id"]

    shown = json.loads(ragsvc("show", str(urgent), "--json"))
    assert shown["status"] == "edited" and shown["decision"]["feedback"] == "missed the point"
    assert "Q: How do I reset my password?" in ragsvc("show", str(urgent))

    assert json.loads(ragsvc("claim", str(normal), "--json"))["claim"]["review_id"] == str(normal)
    assert json.loads(ragsvc("claim", "--json")) == {"claim": None}  # nothing left
    stats = json.loads(ragsvc("stats", "--json"))
    assert stats["by_status"]["edited"] == 1 and stats["agreement"]["relevance"]["n"] == 1
    assert json.loads(ragsvc("expire", "--json")) == {"released": 0, "expired": 0}
