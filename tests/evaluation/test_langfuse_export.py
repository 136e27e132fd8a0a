"""Sending an evaluation run to Langfuse as a dataset run, against a local fake of its public API."""

from __future__ import annotations

import logging
import math
import socket
import uuid
from datetime import UTC, datetime

import pytest

from evaluation.langfuse_export import (
    DEFAULT_HOST,
    LangfuseTarget,
    dataset_item_id,
    export_run,
    score_id,
    trace_id,
)
from rag_service.config import load_settings
from rag_service.domain.eval_runs import DatasetRef, EvalItemResult, EvalRun, EvalRunRequest, RetrievedRef
from tests.langfuse_fake import PUBLIC_KEY, SECRET_KEY, FakeLangfuse, fake_langfuse

DATASET = "ragsvc/qa/faq:dev@0123456789abcdef"


def make_run(name: str | None = "baseline", *, dataset_name: str = "faq", split: str | None = "dev") -> EvalRun:
    return EvalRun(
        id=uuid.UUID("11111111-2222-3333-4444-555555555555"), name=name, status="finished",
        dataset=DatasetRef(kind="qa", name=dataset_name, version="0123456789abcdef", split=split, items=2),
        mode="full", collection="eval-faq", request=EvalRunRequest(dataset="qa:faq.jsonl", mode="full", repeat=2),
        config={"k": 10}, config_hash="cfg-hash", code_version="abc1234", seed=0, items_total=4, items_done=4,
        summary={"ndcg@10": {"mean": 0.5, "count": 4}, "odd": float("nan")},
        created_at=datetime(2025, 1, 2, 3, 4, 5), started_at=datetime(2025, 1, 2, 3, 4, 6, tzinfo=UTC),
    )


def make_results() -> list[EvalItemResult]:
    """Two items, two repetitions each; None and NaN metrics must not become scores."""
    results = []
    for item, question, refs in (("q1", "What is RAG?", ["retrieval augmented generation"]), ("q2", "Who?", [])):
        for rep in range(2):
            results.append(EvalItemResult(
                item_id=item, repetition=rep, question=question, references=refs,
                retrieved=[RetrievedRef(rank=2, id=f"{item}-doc-b"), RetrievedRef(rank=1, id=f"{item}-doc-a")],
                answer=f"answer {item}/{rep}" if item == "q1" else None, outcome="answered" if item == "q1" else None,
                metrics={"ndcg@10": 0.25 * (rep + 1), "faithfulness": None if item == "q2" else 0.9,
                         "latency_ms": 120.0 + rep, "squad_f1": float("nan")},
                scorers={"faithfulness": "local"}, latency_ms={"total": 120.0 + rep},
            ))
    return results


def expected_scores(run: EvalRun, results: list[EvalItemResult]) -> dict[tuple[str, str], float]:
    return {(trace_id(run, r), name): value for r in results for name, value in r.metrics.items()
            if value is not None and math.isfinite(value)}


def target_for(fake: FakeLangfuse, *, secret: str = SECRET_KEY) -> LangfuseTarget:
    return LangfuseTarget(host=fake.url, public_key=PUBLIC_KEY, secret_key=secret)


async def test_a_run_becomes_a_dataset_items_traces_run_items_and_exactly_its_scores() -> None:
    run, results = make_run(), make_results()
    with fake_langfuse() as fake:
        report = await export_run(target_for(fake), run, results)

    assert report.errors == []
    assert (report.dataset, report.run_name) == (DATASET, "baseline")
    assert (report.items, report.traces, report.run_items) == (2, 4, 4)
    assert list(fake.datasets) == [DATASET]
    assert fake.datasets[DATASET]["metadata"]["version"] == "0123456789abcdef"

    # One dataset item per item (not per repetition), input and expected output as Langfuse shows them.
    items = {item["metadata"]["item_id"]: item for item in fake.dataset_items.values()}
    assert set(items) == {"q1", "q2"}
    assert items["q1"]["id"] == dataset_item_id(DATASET, "q1")
    assert items["q1"]["input"] == {"question": "What is RAG?"}
    assert items["q1"]["expectedOutput"] == {"references": ["retrieval augmented generation"]}
    assert items["q2"]["expectedOutput"] is None

    # One trace per result, with the answer (or the retrieved ids, in rank order) and the run's facts.
    assert set(fake.traces) == {trace_id(run, r) for r in results}
    first = fake.traces[trace_id(run, results[1])]
    assert first["input"] == {"question": "What is RAG?"}
    assert first["output"]["answer"] == "answer q1/1"
    assert first["metadata"]["run_id"] == str(run.id) and first["metadata"]["repetition"] == 1
    assert first["metadata"]["outcome"] == "answered" and first["metadata"]["latency_ms"] == {"total": 121.0}
    assert fake.traces[trace_id(run, results[2])]["output"] == {"retrieved": ["q2-doc-a", "q2-doc-b"]}
    assert first["timestamp"] == "2025-01-02T03:04:06.000Z"

    # One run item per result, linking its dataset item and its trace, all in one run.
    links = {(ri["datasetItemId"], ri["traceId"]) for ri in fake.run_items}
    assert links == {(dataset_item_id(DATASET, r.item_id), trace_id(run, r)) for r in results}
    assert len(fake.run_items) == 4
    [(key, langfuse_run)] = fake.runs.items()
    assert key == (fake.datasets[DATASET]["id"], "baseline")
    assert langfuse_run["metadata"]["run_id"] == str(run.id)
    assert langfuse_run["metadata"]["summary"]["odd"] is None  # NaN is not JSON

    # Exactly the finite, non-None metrics, each with its value, as NUMERIC scores on its trace.
    got = {(s["traceId"], s["name"]): s["value"] for s in fake.scores.values()}
    assert got == expected_scores(run, results)
    assert report.scores == len(got) == 4 * 2 + 2 * 1  # ndcg@10 and latency_ms everywhere, faithfulness on q1
    assert all(s["dataType"] == "NUMERIC" for s in fake.scores.values())
    assert {s["comment"] for s in fake.scores.values() if s["name"] == "faithfulness"} == {"scorer: local"}
    assert score_id(trace_id(run, results[0]), "ndcg@10") in fake.scores


async def test_a_re_export_upserts_instead_of_duplicating() -> None:
    run, results = make_run(), make_results()
    with fake_langfuse() as fake:
        first = await export_run(target_for(fake), run, results)
        item_ids = set(fake.dataset_items)
        second = await export_run(target_for(fake), run, results)

    assert first.errors == [] and second.errors == []
    assert len(fake.calls("POST", "/api/public/dataset-items")) == 4  # sent twice ...
    assert set(fake.dataset_items) == item_ids and len(item_ids) == 2  # ... upserted on the same ids
    assert len(fake.traces) == 4 and len(fake.scores) == first.scores
    assert len(fake.run_items) == 4  # the second export found the links and added none
    assert second.run_items == 4 and len(fake.calls("POST", "/api/public/dataset-run-items")) == 4


async def test_the_ingestion_is_sent_in_batches_of_the_given_size() -> None:
    run, results = make_run(), make_results()
    with fake_langfuse() as fake:
        report = await export_run(target_for(fake), run, results, batch_size=3)
    batches = [call["body"]["batch"] for call in fake.calls("POST", "/api/public/ingestion")]
    events = 4 + report.scores
    assert [len(b) for b in batches] == [3] * (events // 3) + ([events % 3] if events % 3 else [])
    assert [e["type"] for b in batches for e in b].count("trace-create") == 4
    assert report.errors == []


async def test_wrong_keys_are_a_401_in_the_report_not_an_exception(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = "sk-lf-wrong-secret-value"
    with fake_langfuse() as fake:
        report = await export_run(target_for(fake, secret=wrong), make_run(), make_results())

    assert report.errors[0].startswith("POST /api/public/v2/datasets: HTTP 401")
    assert len(fake.requests) == 1  # stopped at the first refusal: not one 401 per item
    assert fake.datasets == {} and fake.traces == {} and fake.scores == {}
    assert (report.items, report.scores, report.run_items) == (0, 0, 0)
    assert not any(wrong in e or SECRET_KEY in e for e in report.errors)
    assert wrong not in caplog.text
    assert [r.levelno for r in caplog.records if r.name == "evaluation.langfuse_export"] == [logging.WARNING]


async def test_a_server_that_is_down_is_recorded_without_an_exception_or_an_error_log(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    target = LangfuseTarget(host=f"http://127.0.0.1:{port}", public_key=PUBLIC_KEY, secret_key=SECRET_KEY)

    report = await export_run(target, make_run(), make_results(), timeout_s=2)

    assert report.errors and "POST /api/public/v2/datasets" in report.errors[0]
    assert "ConnectError" in report.errors[0]
    assert (report.items, report.scores, report.traces, report.run_items) == (0, 0, 0, 0)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1
    assert SECRET_KEY not in caplog.text


async def test_a_slow_server_times_out_into_the_report() -> None:
    with fake_langfuse() as fake:
        fake.delay_s = 0.5
        report = await export_run(target_for(fake), make_run(), make_results(), timeout_s=0.1)
    assert report.errors[0].startswith("POST /api/public/v2/datasets: no answer")
    assert "timed out" in report.errors[0]


async def test_refused_items_and_traces_are_reported_and_left_unlinked() -> None:
    """As a Langfuse v4 deployment in events_only mode: trace events are refused per event (207)."""
    run, results = make_run(), make_results()
    with fake_langfuse() as fake:
        fake.reject_event_types = {"trace-create"}
        report = await export_run(target_for(fake), run, results)

    assert report.traces == 0 and report.run_items == 0 and fake.run_items == []
    assert report.scores == len(expected_scores(run, results))  # score events are still accepted
    refused = [e for e in report.errors if e.startswith("POST /api/public/ingestion: trace-create")]
    assert len(refused) == 4 and all("status 400" in e for e in refused)


async def test_a_failing_endpoint_names_itself_and_the_rest_still_goes() -> None:
    with fake_langfuse() as fake:
        fake.fail["POST /api/public/dataset-run-items"] = 500
        report = await export_run(target_for(fake), make_run(), make_results())
    assert report.errors[:4] == ["POST /api/public/dataset-run-items: HTTP 500 (fake failure)"] * 4
    assert len(report.errors) == 4
    assert (report.items, report.traces, report.run_items) == (2, 4, 0)


async def test_dataset_names_follow_langfuse_rules_and_the_run_name_falls_back_to_the_id() -> None:
    run = make_run(name=None, dataset_name="<b>my/data set</b>", split=None)
    with fake_langfuse() as fake:
        report = await export_run(target_for(fake), run, make_results())
    assert report.errors == []
    assert report.run_name == str(run.id)
    assert report.dataset == "ragsvc/qa/b_my_data_set_b@0123456789abcdef"
    assert list(fake.datasets) == [report.dataset]
    assert {ri["datasetRunName"] for ri in fake.run_items} == {str(run.id)}


def test_from_settings_needs_both_keys_and_defaults_the_host() -> None:
    assert LangfuseTarget.from_settings(load_settings()) is None
    assert LangfuseTarget.from_settings(load_settings(langfuse_public_key=PUBLIC_KEY)) is None
    assert LangfuseTarget.from_settings(load_settings(langfuse_host="https://lf.example",
                                                      langfuse_secret_key=SECRET_KEY)) is None

    default = LangfuseTarget.from_settings(load_settings(langfuse_public_key=PUBLIC_KEY,
                                                         langfuse_secret_key=SECRET_KEY))
    assert default is not None and default.host == DEFAULT_HOST == "https://cloud.langfuse.com"
    assert (default.public_key, default.secret_key) == (PUBLIC_KEY, SECRET_KEY)

    own = LangfuseTarget.from_settings(load_settings(langfuse_host="https://lf.example/ ",
                                                     langfuse_public_key=PUBLIC_KEY, langfuse_secret_key=SECRET_KEY))
    assert own is not None and own.host == "https://lf.example"
    assert SECRET_KEY not in repr(own) and PUBLIC_KEY not in repr(own)
