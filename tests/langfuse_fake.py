"""A small local HTTP server that speaks the parts of Langfuse's public REST API the evaluation export
uses (no Langfuse is reachable here), and records what it received.

It follows the real server where the export could get it wrong (github.com/langfuse/langfuse:
``fern/apis/server/definition/*.yml``, ``web/src/features/public-api/types/datasets.ts``,
``web/src/pages/api/public/{ingestion,dataset-run-items}.ts``,
``packages/shared/src/server/ingestion/types.ts``):

* Basic auth with the project's public key (username) and secret key (password), else 401
  ``{"message": ...}`` (``{"error": "UnauthorizedError", "message": ...}`` from the ingestion route);
* ``POST /api/public/v2/datasets`` upserts by name, refuses names Langfuse's ``DatasetNameSchema``
  refuses (leading/trailing ``/``, ``//``, an HTML tag, empty) and answers the dataset object;
* ``POST /api/public/dataset-items`` upserts on ``id``; the dataset must exist (404), an id used by
  another dataset is refused (409);
* ``POST /api/public/ingestion`` answers 207 ``{successes, errors}``, one entry per event, checking the
  envelope (id, ISO timestamp with offset, type) and the trace/score bodies; traces and scores upsert
  on their body id;
* ``POST /api/public/dataset-run-items`` takes only the keys the strict schema allows, needs an
  existing dataset item (404), makes the run on first use and a fresh run item id every time;
* ``GET /api/public/dataset-run-items?datasetId=&runName=&page=&limit=`` pages through a run's items,
  404 when the run does not exist;
* ``POST /api/public/otel/v1/traces`` takes what the SDK (v3+) exports over OTLP/HTTP (protobuf, gzip)
  and keeps each span, decoded (``spans``);
* ``POST /api/public/scores`` takes the SDK's score batches (a JSON list) and answers 202
  ``{"message": "Accepted"}``; scores upsert on their id.

Tests can make a path fail (``fail``), slow (``delay_s``) or reject event types at ingestion
(``reject_event_types``, as a Langfuse v4 deployment in events_only mode rejects trace events).
"""

from __future__ import annotations

import base64
import json
import math
import re
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.http_fakes import running, send_json
from tests.otlp_decode import decode_spans

PUBLIC_KEY = "pk-lf-fake-public"
SECRET_KEY = "sk-lf-fake-secret"
PROJECT_ID = "fake-project"

# zod's datetime({offset: true}): date, time, optional fraction, then Z or an offset.
_ISO_WITH_OFFSET = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:?\d{2})$")
_HTML = re.compile(r"<[^>]*>")
_RUN_ITEM_KEYS = {"runName", "runDescription", "metadata", "datasetItemId", "observationId", "traceId",
                  "datasetVersion", "createdAt"}


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class FakeLangfuse:
    url: str = ""
    public_key: str = PUBLIC_KEY
    secret_key: str = SECRET_KEY
    requests: list[dict[str, Any]] = field(default_factory=list)  # method, path, query, body, authorized
    datasets: dict[str, dict[str, Any]] = field(default_factory=dict)  # by name
    dataset_items: dict[str, dict[str, Any]] = field(default_factory=dict)  # by id
    traces: dict[str, dict[str, Any]] = field(default_factory=dict)  # by body id, the last version
    scores: dict[str, dict[str, Any]] = field(default_factory=dict)  # by body id, the last version
    runs: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # by (dataset id, run name)
    run_items: list[dict[str, Any]] = field(default_factory=list)
    spans: list[dict[str, Any]] = field(default_factory=list)  # OTLP spans, decoded (tests/otlp_decode.py)
    defer_decoding: bool = False  # keep the OTLP bodies (otlp_bodies) until decode_deferred() is called
    otlp_bodies: list[tuple[bytes, str | None]] = field(default_factory=list)
    fail: dict[str, int] = field(default_factory=dict)  # "POST /api/public/..." -> status to answer
    delay_s: float = 0.0
    reject_event_types: set[str] = field(default_factory=set)

    def decode_deferred(self) -> None:
        self.spans.extend(span for raw, encoding in self.otlp_bodies for span in decode_spans(raw, encoding))
        self.otlp_bodies.clear()

    def calls(self, method: str, path: str) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["method"] == method and r["path"] == path]

    def ingested_events(self) -> list[dict[str, Any]]:
        return [event for r in self.calls("POST", "/api/public/ingestion") if r["authorized"]
                for event in (r["body"] or {}).get("batch", [])]

    # --- the endpoints (called under the lock) -----------------------------------------------------
    def create_dataset(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        name = body.get("name")
        if not isinstance(name, str) or (problem := _dataset_name_problem(name)):
            return 400, {"message": f"Dataset name not valid. {problem if isinstance(name, str) else 'required'}"}
        name = name.strip()
        now = _now()
        dataset = self.datasets.get(name)
        if dataset is None:
            dataset = {"id": str(uuid.uuid4()), "projectId": PROJECT_ID, "name": name, "description": None,
                       "metadata": None, "inputSchema": None, "expectedOutputSchema": None,
                       "createdAt": now, "updatedAt": now}
            self.datasets[name] = dataset
        for key in ("description", "metadata"):
            if body.get(key) is not None:
                dataset[key] = body[key]
        dataset["updatedAt"] = now
        return 200, dict(dataset)

    def upsert_item(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        dataset = self.datasets.get(body.get("datasetName"))
        if dataset is None:
            return 404, {"message": "Dataset not found"}
        item_id = body.get("id") or str(uuid.uuid4())
        if not isinstance(item_id, str) or not 1 <= len(item_id) <= 800:
            return 400, {"message": "Invalid request data"}
        now = _now()
        item = self.dataset_items.get(item_id)
        if item is not None and item["datasetId"] != dataset["id"]:
            return 409, {"message": "Dataset item id already in use by another dataset"}
        if item is None:
            item = {"id": item_id, "datasetId": dataset["id"], "datasetName": dataset["name"], "status": "ACTIVE",
                    "input": None, "expectedOutput": None, "metadata": None, "sourceTraceId": None,
                    "sourceObservationId": None, "createdAt": now}
            self.dataset_items[item_id] = item
        for key in ("input", "expectedOutput", "metadata", "sourceTraceId", "sourceObservationId"):
            if key in body:
                item[key] = body[key]
        item["status"] = body.get("status") or item["status"]
        item["updatedAt"] = now
        return 200, dict(item)

    def ingest(self, body: Any) -> tuple[int, dict[str, Any]]:
        if not isinstance(body, dict) or not isinstance(body.get("batch"), list):
            return 400, {"message": "Invalid request data", "errors": ["batch: expected array"]}
        successes, errors = [], []
        seen: set[str] = set()
        for event in body["batch"]:
            event_id = event.get("id") if isinstance(event, dict) else None
            problem = self._event_problem(event, seen)
            if problem:
                errors.append({"id": event_id or "unknown", "status": 400, "message": "Invalid request data",
                               "error": problem})
                continue
            seen.add(event_id)
            store = self.traces if event["type"] == "trace-create" else self.scores
            previous = store.get(event["body"]["id"], {})
            store[event["body"]["id"]] = {**previous, **event["body"]}
            successes.append({"id": event_id, "status": 201})
        return 207, {"successes": successes, "errors": errors}

    def _event_problem(self, event: Any, seen: set[str]) -> str | None:
        if not isinstance(event, dict):
            return "event: expected object"
        if not isinstance(event.get("id"), str) or not event["id"] or event["id"] in seen:
            return "id: a unique non-empty string is required"
        if not isinstance(event.get("timestamp"), str) or not _ISO_WITH_OFFSET.match(event["timestamp"]):
            return "timestamp: Invalid datetime"
        kind, body = event.get("type"), event.get("body")
        if kind in self.reject_event_types:
            return f'Event type "{kind}" is not accepted by /api/public/ingestion'
        if not isinstance(body, dict):
            return "body: expected object"
        if kind == "trace-create":
            if not isinstance(body.get("id"), str) or not 1 <= len(body["id"]) <= 800:
                return "body.id: required for this export"  # optional in Langfuse; the export always sets it
            if body.get("timestamp") is not None and not _ISO_WITH_OFFSET.match(str(body["timestamp"])):
                return "body.timestamp: Invalid datetime"
            if body.get("name") is not None and len(str(body["name"])) > 1000:
                return "body.name: too long"
            return None
        if kind == "score-create":
            if not isinstance(body.get("name"), str) or not body["name"]:
                return "body.name: String must contain at least 1 character(s)"
            if not isinstance(body.get("id"), str) or not body.get("traceId"):
                return "body.id and body.traceId: required for this export"
            value = body.get("value")
            if body.get("dataType") == "NUMERIC" and (
                    isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value)):
                return "body.value: Expected number"
            return None
        return f"type: unknown event type {kind!r}"

    def create_run_item(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        extra = set(body) - _RUN_ITEM_KEYS
        if extra:
            return 400, {"message": "Invalid request data", "error": f"Unrecognized key(s): {sorted(extra)}"}
        if not isinstance(body.get("runName"), str) or not body["runName"]:
            return 400, {"message": "Invalid request data", "error": "runName: Required"}
        if not body.get("traceId") and not body.get("observationId"):
            return 400, {"message": "observationId or traceId must be provided"}
        item = self.dataset_items.get(body.get("datasetItemId"))
        if item is None or item["status"] != "ACTIVE":
            return 404, {"message": "Dataset item not found"}
        now = _now()
        key = (item["datasetId"], body["runName"])
        run = self.runs.get(key)
        if run is None:
            run = {"id": str(uuid.uuid4()), "name": body["runName"], "datasetId": item["datasetId"],
                   "description": None, "metadata": None, "createdAt": now}
            self.runs[key] = run
        if body.get("runDescription") is not None:
            run["description"] = body["runDescription"]
        if body.get("metadata") is not None:
            run["metadata"] = body["metadata"]
        run["updatedAt"] = now
        run_item = {"id": str(uuid.uuid4()), "datasetRunId": run["id"], "datasetRunName": run["name"],
                    "datasetItemId": item["id"], "traceId": body.get("traceId"),
                    "observationId": body.get("observationId"), "createdAt": now, "updatedAt": now}
        self.run_items.append(run_item)
        return 200, dict(run_item)

    def list_run_items(self, query: dict[str, str]) -> tuple[int, dict[str, Any]]:
        run = self.runs.get((query.get("datasetId", ""), query.get("runName", "")))
        if run is None:
            return 404, {"message": "Dataset run not found for the given project and dataset id"}
        try:
            page, limit = int(query.get("page", "1")), int(query.get("limit", "50"))
        except ValueError:
            return 400, {"message": "Invalid request data"}
        rows = [r for r in self.run_items if r["datasetRunId"] == run["id"]]
        start = (page - 1) * limit
        return 200, {"data": rows[start:start + limit],
                     "meta": {"page": page, "limit": limit, "totalItems": len(rows),
                              "totalPages": math.ceil(len(rows) / limit)}}


def _dataset_name_problem(name: str) -> str | None:
    if not name:
        return "Text cannot be empty"
    if _HTML.search(name):
        return "Text cannot contain HTML tags"
    if name.startswith("/"):
        return "Name cannot start with a slash"
    if "//" in name:
        return "Name cannot contain consecutive slashes"
    if name.endswith("/"):
        return "Name cannot end with a slash"
    if not name.strip():
        return "Name cannot be empty"
    return None


@contextmanager
def fake_langfuse(public_key: str = PUBLIC_KEY, secret_key: str = SECRET_KEY) -> Iterator[FakeLangfuse]:
    state = FakeLangfuse(public_key=public_key, secret_key=secret_key)
    lock = threading.Lock()
    expected = "Basic " + base64.b64encode(f"{public_key}:{secret_key}".encode()).decode()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body leave in one segment (flushed after each request), with TCP_NODELAY: else
        # every keep-alive request waits out the peer's delayed ACK (about 40 ms).
        wbufsize = 64 * 1024
        disable_nagle_algorithm = True

        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 - the http.server API
            self._handle("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._handle("POST")

        def _handle(self, method: str) -> None:
            parts = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            otlp = parts.path == "/api/public/otel/v1/traces"
            try:
                body = None if otlp else json.loads(raw) if raw else None
            except ValueError:
                body = None
            query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
            authorized = self.headers.get("Authorization") == expected
            with lock:
                state.requests.append({"method": method, "path": parts.path, "query": query, "body": body,
                                       "authorized": authorized})
            if state.delay_s:
                time.sleep(state.delay_s)
            endpoint = f"{method} {parts.path}"
            if not authorized:
                message = ("Invalid credentials. Confirm that you've configured the correct host."
                           if self.headers.get("Authorization") else "No authorization header")
                payload = {"error": "UnauthorizedError", "message": message} if parts.path.endswith(
                    "/ingestion") else {"message": message}
                return send_json(self, 401, payload)
            if endpoint in state.fail:
                return send_json(self, state.fail[endpoint], {"message": "fake failure"})
            if otlp and method == "POST":
                encoding = self.headers.get("Content-Encoding")
                with lock:
                    if state.defer_decoding:  # a benchmark: decode after the measurement, not during it
                        state.otlp_bodies.append((raw, encoding))
                    else:
                        state.spans.extend(decode_spans(raw, encoding))
                return send_json(self, 200, {})
            if endpoint == "POST /api/public/scores" and isinstance(body, list):
                with lock:
                    state.scores.update({score["id"]: score for score in body if isinstance(score, dict)})
                return send_json(self, 202, {"message": "Accepted"})
            if method == "POST" and not isinstance(body, dict):
                return send_json(self, 400, {"message": "Invalid request data"})
            with lock:
                status, payload = self._route(endpoint, body, query)
            send_json(self, status, payload)

        def _route(self, endpoint: str, body: Any, query: dict[str, str]) -> tuple[int, dict[str, Any]]:
            if endpoint == "POST /api/public/v2/datasets":
                return state.create_dataset(body)
            if endpoint == "POST /api/public/dataset-items":
                return state.upsert_item(body)
            if endpoint == "POST /api/public/ingestion":
                return state.ingest(body)
            if endpoint == "POST /api/public/dataset-run-items":
                return state.create_run_item(body)
            if endpoint == "GET /api/public/dataset-run-items":
                return state.list_run_items(query)
            return 404, {"message": "Not found"}

    with running(Handler) as url:
        state.url = url
        yield state
