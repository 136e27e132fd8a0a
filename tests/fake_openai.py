"""A small local HTTP server that speaks the OpenAI chat completions API (no hosted LLM is
reachable here). Tests queue replies; each request takes the next one (or a default).

Callers that send several prompts concurrently (ragas) make the order of requests unpredictable;
``on(text, ...)`` answers the requests whose messages contain ``text`` from their own queue."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler

import pytest

from tests.http_fakes import running, send_json


def _usage(body: dict, content: str) -> dict[str, int]:
    """Token counts as a server reports them (here: four characters a token)."""
    prompt = sum(len(m.get("content") or "") for m in body.get("messages", [])) // 4 + 1
    completion = len(content) // 4 + 1
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


@dataclass
class Reply:
    content: str = ""
    status: int = 200
    delay_s: float = 0.0
    piece_delay_s: float = 0.0  # between streamed pieces: a stream that trickles


def _reply(content: str | Reply) -> Reply:
    return content if isinstance(content, Reply) else Reply(content)


@dataclass
class FakeOpenAI:
    url: str = ""
    requests: list[dict] = field(default_factory=list)
    replies: list[Reply] = field(default_factory=list)
    default: Reply = field(default_factory=lambda: Reply("ok"))
    routes: list[tuple[str, list[Reply]]] = field(default_factory=list)

    def queue(self, *contents: str | Reply) -> None:
        self.replies.extend(_reply(c) for c in contents)

    def on(self, text: str, *contents: str | Reply) -> None:
        """Requests whose message text contains ``text`` take these replies in order, the last one
        repeating; routes are tried in the order they were added, before the plain queue."""
        if not contents:
            raise ValueError("on() needs at least one reply")
        self.routes.append((text, [_reply(c) for c in contents]))

    def reset(self) -> None:
        """Forget requests, replies and routes (one server shared by several tests)."""
        self.requests.clear()
        self.replies.clear()
        self.routes.clear()
        self.default = Reply("ok")

    def next_reply(self, body: dict) -> Reply:
        prompt = "\n".join(str(m.get("content", "")) for m in body.get("messages", []))
        for text, replies in self.routes:
            if text in prompt:
                return replies.pop(0) if len(replies) > 1 else replies[0]
        return self.replies.pop(0) if self.replies else self.default


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
                reply = state.next_reply(body)
            if reply.delay_s:
                time.sleep(reply.delay_s)
            if reply.status != 200:
                return self._json(reply.status, {"error": {"message": "fake failure", "type": "server_error"}})
            if body.get("stream"):
                return self._stream(body, reply.content, reply.piece_delay_s)
            self._json(200, {
                "id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": reply.content}}],
                "usage": _usage(body, reply.content),
            })

        def _json(self, status: int, payload: dict) -> None:
            send_json(self, status, payload)

        def _stream(self, body: dict, content: str, piece_delay_s: float = 0.0) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            pieces = [content[i:i + 4] for i in range(0, len(content), 4)]
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                for piece in pieces:
                    time.sleep(piece_delay_s)
                    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": body["model"],
                             "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                if (body.get("stream_options") or {}).get("include_usage"):  # as OpenAI: a last chunk
                    last = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": body["model"],
                            "choices": [], "usage": _usage(body, content)}
                    self.wfile.write(f"data: {json.dumps(last)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")
            self.close_connection = True

    with running(Handler) as url:
        state.url = url + "/v1"
        yield state


# --- fixtures (import them into a test module or conftest to use them) -------------------------------------

@pytest.fixture(scope="module")
def shared_server() -> Iterator[FakeOpenAI]:
    with fake_openai() as server:
        yield server


@pytest.fixture
def server(shared_server: FakeOpenAI) -> FakeOpenAI:
    """One server for the module (stopping one takes half a second), emptied for each test."""
    shared_server.reset()
    return shared_server
