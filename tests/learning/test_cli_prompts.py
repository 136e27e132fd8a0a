"""``ragsvc prompts``, ``ragsvc guidelines`` and ``ragsvc experiments`` as the local operator, on
a real database: create, label, history, diff, rollback, an experiment's start, report and stop,
a decision whose corrected prompt becomes a candidate, and errors that say what to fix."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rag_service.cli import app as cli
from rag_service.errors import ConflictError
from tests.dbrun import run_on
from tests.review.conftest import DbRun
from tests.review.seed import seed

CONFLICT = ConflictError("x").exit_code


@pytest.fixture(scope="module")
def db_run(migrated_url: str) -> DbRun:
    return functools.partial(run_on, migrated_url)


@pytest.fixture
def ragsvc(migrated_url: str, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    monkeypatch.setenv("RAGSVC_DATABASE_URL", migrated_url)
    runner = CliRunner()

    def run(*args: str, code: int = 0) -> str:
        result = runner.invoke(cli, list(args))
        assert result.exit_code == code, result.output
        return result.stdout if code == 0 else " ".join(result.output.split())

    return run


def test_versions_labels_and_an_experiment_from_the_terminal(ragsvc, tmp_path: Path) -> None:  # noqa: ANN001
    names = {p["name"] for p in json.loads(ragsvc("prompts", "list", "--json"))["data"]}
    assert {"answer_cot", "answer_extractive", "judge_cot", "prompt_optimizer"} <= names
    template = tmp_path / "better.j2"
    template.write_text("[system]\nAnswer in one short paragraph, citing [n].\n[user]\n"
                        "{% for p in passages %}[{{ loop.index }}] {{ p.text }}\n{% endfor %}{{ question }}\n")
    created = json.loads(ragsvc("prompts", "create", "answer_cot", "--body-file", str(template), "--label",
                                "candidate", "--note", "shorter", "--json"))
    assert (created["version"], created["labels"], created["source"]) == (2, ["candidate"], "manual")
    assert "Answer in one short paragraph" in ragsvc("prompts", "show", "answer_cot", "--version", "2")
    assert "+Answer in one short paragraph" in ragsvc("prompts", "diff", "answer_cot", "1", "2")
    assert "--parameters must be a JSON object" in ragsvc("prompts", "create", "answer_cot", "--parameters", "{x",
                                                          code=2)
    broken = tmp_path / "broken.j2"
    broken.write_text("[system]\n{{ question\n")
    assert "not valid Jinja2" in ragsvc("prompts", "create", "answer_cot", "--body-file", str(broken), code=2)
    assert "cannot read" in ragsvc("prompts", "create", "answer_cot", "--body-file", str(tmp_path / "no.j2"), code=2)

    experiment = json.loads(ragsvc("experiments", "start", "answer_cot", "--share", "0.2", "--json"))
    assert (experiment["control_version"], experiment["candidate_version"], experiment["share"]) == (1, 2, 0.2)
    assert "already has a running experiment" in ragsvc("experiments", "start", "answer_cot", code=CONFLICT)
    report = json.loads(ragsvc("experiments", "report", experiment["id"], "--json"))
    assert report["decision"] == "undecided" and [v["answers"] for v in report["variants"]] == [0, 0]
    assert "decision: undecided" in " ".join(ragsvc("experiments", "report", experiment["id"]).split())
    json.loads(ragsvc("experiments", "stop", experiment["id"], "--reason", "done", "--json"))
    assert json.loads(ragsvc("experiments", "list", "--json"))["data"][0]["status"] == "stopped"

    moved = json.loads(ragsvc("prompts", "label", "answer_cot", "production", "2", "--reason", "try", "--json"))
    assert (moved["from_version"], moved["to_version"]) == (1, 2)
    back = json.loads(ragsvc("prompts", "rollback", "answer_cot", "--json"))
    assert (back["from_version"], back["to_version"]) == (2, 1)
    history = json.loads(ragsvc("prompts", "history", "answer_cot", "--label", "production", "--json"))["data"]
    assert [(m["from_version"], m["to_version"]) for m in history] == [(2, 1), (1, 2), (None, 1)]
    guidelines = json.loads(ragsvc("guidelines", "versions", "--json"))
    assert guidelines["count"] == 1 and guidelines["data"][0]["labels"] == ["production"]


def test_a_corrected_prompt_from_review_decide_becomes_a_candidate(ragsvc, db_run: DbRun,  # noqa: ANN001
                                                                   tmp_path: Path) -> None:
    _, review_id = seed(db_run, collection="cli-loop", prompt_name="judge_cot", prompt_version=1)
    ragsvc("review", "claim", str(review_id))
    prompt = tmp_path / "judge.j2"
    prompt.write_text("[system]\nGrade strictly.\n[user]\n{{ question }}\n{% for c in contexts %}{{ c.text }}\n"
                      "{% endfor %}{{ answer }}\n")
    assert "must be JSON" in ragsvc("review", "decide", str(review_id), "--decision", "approved", "--category",
                                    "routing", "--corrected-routing", "{oops", code=2)
    decided = json.loads(ragsvc("review", "decide", str(review_id), "--decision", "approved", "--category",
                                "answer_quality", "--corrected-prompt", str(prompt), "--json"))
    version = decided["candidate_prompt_version"]
    candidate = json.loads(ragsvc("prompts", "show", "judge_cot", "--version", str(version), "--json"))
    assert candidate["source"] == "review" and candidate["review_ids"] == [str(review_id)]
    assert candidate["labels"] == ["candidate"]
