"""A small local HTTP server that speaks the OpenAI chat completions API (no hosted LLM is
reachable here). Tests queue replies; each request takes the next one (or a default)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler

from tests.http_fakes import running, send_json


@dataclass
class Reply:
    content: str = ""
    status: int = 200
    delay_s: float = 0.0


@dataclass
class FakeOpenAI:
    url: str = ""
    requests: list[dict] = field(default_factory=list)
    replies: list[Reply] = field(default_factory=list)
    default: Reply = field(default_factory=lambda: Reply("ok"))

    def queue(self, *contents: str | Reply) -> None:
        self.replies.extend(c if isinstance(c, Reply) else Reply(c) for c in contents)


@contextmanager
def fake_openai() -> Iterator[FakeOpenAI]:
    state = FakeOpenAI()
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802 - the http.server API
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with lock:
                state.requests.append({"path": self.path, "body": body})
                reply = state.replies.pop(0) if state.replies else state.default
            if reply.delay_s:
                time.sleep(reply.delay_s)
            if reply.status != 200:
                return self._json(reply.status, {"error": {"message": "fake failure", "type": "server_error"}})
            if body.get("stream"):
                return self._stream(body, reply.content)
            self._json(200, {
                "id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": reply.content}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            })

        def _json(self, status: int, payload: dict) -> None:
            send_json(self, status, payload)

        def _stream(self, body: dict, content: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            pieces = [content[i:i + 4] for i in range(0, len(content), 4)]
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                for piece in pieces:
                    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": body["model"],
                             "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                self.wfile.write(b"data: [DONE]\n\n")
            self.close_connection = True

    with running(Handler) as url:
        state.url = url + "/v1"
        yield state
