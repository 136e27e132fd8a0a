"""A small local HTTP server that speaks Cohere's v2 rerank API (no hosted API is reachable here).

It scores each document by how many query words it contains, so tests can predict the order,
and can be told to fail or to stall to exercise the retriever's fallbacks.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler

from tests.http_fakes import running, send_json


@dataclass
class FakeCohere:
    url: str
    requests: list[dict] = field(default_factory=list)
    mode: str = "ok"  # ok | error | slow | bad-index
    delay_s: float = 3.0


@contextmanager
def fake_cohere() -> Iterator[FakeCohere]:
    state = FakeCohere(url="")

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # keep test output quiet
            pass

        def do_POST(self) -> None:  # noqa: N802 - the http.server API
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            state.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
            if state.mode == "error":
                return self._send(500, {"message": "internal server error"})
            if state.mode == "slow":
                time.sleep(state.delay_s)
            if self.path != "/v2/rerank":
                return self._send(404, {"message": f"no route {self.path}"})
            words = set(body["query"].lower().split())
            scored = [(sum(w in doc.lower() for w in words) / max(len(words), 1), i)
                      for i, doc in enumerate(body["documents"])]
            scored.sort(key=lambda s: (-s[0], s[1]))
            results = [{"index": i, "relevance_score": s} for s, i in scored[: body.get("top_n") or len(scored)]]
            if state.mode == "bad-index":
                results[0]["index"] = 999
            self._send(200, {"id": "fake", "results": results, "meta": {"billed_units": {"search_units": 1}}})

        def _send(self, status: int, payload: dict) -> None:
            send_json(self, status, payload)

    with running(Handler) as url:
        state.url = url
        yield state
