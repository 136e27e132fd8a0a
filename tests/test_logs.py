"""Structured logs: JSON lines with the request id, given back in X-Request-ID and carried into the
job a request queues; secrets and personal data never reach a log line."""

from __future__ import annotations

import io
import json
import logging
import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from rag_service.api import create_app
from rag_service.config import load_settings
from rag_service.observability.logs import JsonFormatter, Redactor, RequestIdFilter
from rag_service.pipeline.guardrails import mask_pii

SECRET = "sk-live-8f3b2c1d9e7a"


def _redactor() -> Redactor:
    return Redactor([SECRET, "hunter2pw"], mask_personal=mask_pii)


def test_the_redactor_replaces_secrets_keys_tokens_passwords_and_personal_data() -> None:
    line = _redactor()(
        f"calling with {SECRET}; key rsk_AbCdEfGh12345678xyz; header Bearer eyJhbGciOiJIUzI1NiJ9.abc; "
        "db postgresql://app:hunter2pw@db:5432/rag and postgresql://u:other-pw@h/db?password=p4ss; "
        "user jane.doe@example.com phone +44 20 7946 0958")
    for leaked in (SECRET, "AbCdEfGh12345678", "eyJhbGciOiJIUzI1NiJ9", "hunter2pw", "other-pw", "p4ss",
                   "jane.doe@example.com", "7946 0958"):
        assert leaked not in line, leaked
    assert "rsk_[REDACTED]" in line and "Bearer [REDACTED]" in line and "[EMAIL]" in line


def test_a_json_line_carries_the_request_id_and_a_redacted_exception() -> None:
    record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed for %s", ("jane@example.com",), None)
    try:
        raise RuntimeError(f"token {SECRET}")
    except RuntimeError:
        import sys
        record.exc_info = sys.exc_info()
    record.request_id = "req-1"
    line = json.loads(JsonFormatter(_redactor()).format(record))
    assert line["request_id"] == "req-1" and line["level"] == "ERROR" and line["message"] == "failed for [EMAIL]"
    assert SECRET not in line["exception"] and "RuntimeError" in line["exception"]


@pytest.fixture()
def captured() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(JsonFormatter(_redactor()))
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    yield stream
    root.removeHandler(handler)
    root.setLevel(level)


def _lines(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]


def test_the_request_id_follows_a_request_into_its_logs_and_its_job(migrated_url: str,
                                                                     captured: io.StringIO) -> None:
    settings = load_settings(database_url=migrated_url, serve_worker="on", worker_heartbeat_s=1)
    app = create_app(settings)

    @app.get("/log-probe")
    async def probe() -> dict[str, str]:
        logging.getLogger("probe").warning("probing for jane@example.com with Bearer abcdefghijklmnop")
        return {"ok": "yes"}

    with TestClient(app) as client:
        mine = client.get("/log-probe", headers={"X-Request-ID": "trace-42"})
        assert mine.headers["X-Request-ID"] == "trace-42"
        made = client.get("/log-probe", headers={"X-Request-ID": "not a token"})  # replaced, not echoed
        assert made.headers["X-Request-ID"] != "not a token" and len(made.headers["X-Request-ID"]) == 32
        upload = client.post("/v1/documents", json={"source_uri": "t.md", "text": "Tides follow the moon.",
                                                     "collection": "logs"}, headers={"X-Request-ID": "ingest-7"})
        deadline = time.monotonic() + 60
        while client.get(upload.json()["status_url"]).json()["status"] not in ("succeeded", "failed"):
            assert time.monotonic() < deadline
            time.sleep(0.2)
    lines = _lines(captured)
    probes = [line for line in lines if line["logger"] == "probe"]
    assert [p["request_id"] for p in probes] == ["trace-42", made.headers["X-Request-ID"]]
    assert all("jane@example.com" not in p["message"] and "abcdefghijklmnop" not in p["message"] for p in probes)
    job_lines = [line for line in lines if line["logger"] == "ingestion.jobs" and "succeeded" in line["message"]]
    assert job_lines and job_lines[0]["request_id"] == "ingest-7"  # logged by the worker, under the upload's id


def test_serve_and_worker_log_json_lines_and_other_commands_text(monkeypatch: pytest.MonkeyPatch) -> None:
    from rag_service.cli.common import settings
    from rag_service.config import get_settings
    from rag_service.observability.logs import RedactingFormatter

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    monkeypatch.setenv("RAGSVC_LLM_API_KEY", SECRET)
    get_settings.cache_clear()
    try:
        settings(long_running=True)
        (handler,) = root.handlers
        assert isinstance(handler.formatter, JsonFormatter)
        assert SECRET not in handler.formatter.format(logging.makeLogRecord({"msg": f"key={SECRET}"}))
        settings()
        assert isinstance(root.handlers[0].formatter, RedactingFormatter)
        line = root.handlers[0].formatter.format(logging.makeLogRecord({"msg": "mail jane@example.com",
                                                                        "levelname": "INFO", "name": "x"}))
        assert "[EMAIL]" in line and "[PHONE]" not in line and line[:4].isdigit()  # the timestamp survives
        monkeypatch.setenv("RAGSVC_LOG_FORMAT", "json")
        get_settings.cache_clear()
        settings()
        assert isinstance(root.handlers[0].formatter, JsonFormatter)
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)
        get_settings.cache_clear()
