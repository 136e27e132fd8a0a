"""The MCP server through the SDK's own client, over both transports: streamable HTTP at /mcp of
the app under uvicorn (API keys) and stdio through a `ragsvc mcp` subprocess (the local admin).
Real PostgreSQL, the real local model, the default extractive answerer."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, TextResourceContents

from rag_service.config import load_settings
from rag_service.domain import METRICS
from tests.apps import SMALL_KB, served
from tests.conftest import scratch_dir
from tests.test_auth import bearer, create_key
from tests.test_metrics import _series

RAGSVC = str(Path(sys.executable).parent / "ragsvc")
TOOLS = {"search", "ask", "ingest_text", "list_collections"}
PING = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
ACCEPT = {"Accept": "application/json, text/event-stream"}  # what the transport requires of a POST


@pytest.fixture(scope="module")
def data_dir() -> Iterator[Path]:
    """Shared by the app and the stdio process, so the local model is exported to ONNX once."""
    path = scratch_dir("ragsvc-mcp-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def keys(migrated_url: str) -> dict[str, str]:
    """Keys exist from the start, so a request without one is refused over HTTP."""
    url = migrated_url
    return {"admin": create_key(url, "admin"), "ingester": create_key(url, "ingester"),
            "reader": create_key(url, "reader"), "monitor": create_key(url, "monitor"),
            "other-reader": create_key(url, "reader", collections=["other"]),
            "hr-reader": create_key(url, "reader", principals=["hr"])}


@pytest.fixture(scope="module")
def base(migrated_url: str, keys: dict[str, str], data_dir: Path) -> Iterator[str]:
    settings = load_settings(database_url=migrated_url, data_dir=data_dir, serve_worker="on", worker_heartbeat_s=1,
                             experiment_check_s=0)
    with served(settings) as base_url:
        accepted = httpx.post(f"{base_url}/v1/documents", headers=bearer(keys["admin"]), timeout=30, json=[
            {"source_uri": u, "title": t, "text": x, "collection": "kb"} for u, t, x in SMALL_KB])
        assert accepted.status_code == 202, accepted.text
        status_url = f"{base_url}{accepted.json()['status_url']}"
        deadline = time.monotonic() + 120
        while (job := httpx.get(status_url, headers=bearer(keys["admin"]), timeout=30).json())["status"] not in (
                "succeeded", "failed"):
            assert time.monotonic() < deadline, job
            time.sleep(0.2)
        assert job["status"] == "succeeded", job
        yield base_url


@asynccontextmanager
async def over_http(base_url: str, key: str | None) -> AsyncIterator[Client]:
    headers = bearer(key) if key else {}
    async with httpx2.AsyncClient(headers=headers, timeout=120) as http, \
            Client(streamable_http_client(f"{base_url}/mcp", http_client=http)) as client:
        yield client


def _json(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content


def _error(result: CallToolResult) -> str:
    assert result.is_error, result.structured_content
    return " ".join(block.text for block in result.content if block.type == "text")


async def _read(client: Client, uri: str) -> Any:
    contents = (await client.read_resource(uri)).contents
    assert len(contents) == 1 and isinstance(contents[0], TextResourceContents)
    assert contents[0].mime_type == "application/json"
    return json.loads(contents[0].text)


async def exercise(client: Client, tag: str) -> None:
    """What any MCP client does, checked the same way over either transport."""
    tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert set(tools) == TOOLS
    ask_schema = tools["ask"].input_schema
    assert ask_schema["required"] == ["question"] and ask_schema["properties"]["question"]["description"]
    assert "citations" in tools["ask"].output_schema["properties"]
    assert tools["search"].annotations.read_only_hint and not tools["ingest_text"].annotations.read_only_hint

    collections = {c["name"]: c for c in _json(await client.call_tool("list_collections", {}))["data"]}
    assert collections["kb"]["documents"] >= len(SMALL_KB)  # and what the other transport's run added

    answer = _json(await client.call_tool("ask", {"question": "What raises the ocean tides?", "collection": "kb"}))
    assert answer["outcome"] == "answered" and "[1]" in answer["answer"], answer
    cited = answer["citations"][0]
    assert cited["n"] == 1 and cited["source_uri"] == "tides.md" and cited["verified"]
    assert cited["quote"] and cited["quote"] in SMALL_KB[0][2]
    assert set(answer["evaluation"]["metrics"]) == set(METRICS) and len(METRICS) == 7
    assert 0 <= answer["evaluation"]["overall"] <= 1 and 0 <= answer["confidence"] <= 1

    found = _json(await client.call_tool("search", {"query": "dough rise", "collection": "kb", "top_k": 2}))
    best = found["results"][0]
    assert best["source_uri"] == "bread.md" and best["rank"] == 1 and best["chunk_id"] and best["document_id"]
    assert "Knead the dough" in best["text"] and best["ranks"]["keyword"] == 1

    document = await _read(client, f"ragsvc://documents/{cited['document_id']}")
    assert document["source_uri"] == "tides.md" and document["chunks"][0]["text"] == SMALL_KB[0][2]
    listed = await _read(client, "ragsvc://collections/kb/documents?limit=1")
    assert listed["count"] >= len(SMALL_KB) and len(listed["data"]) == 1
    assert "kb" in [c["name"] for c in (await _read(client, "ragsvc://collections"))["data"]]

    uri = f"{tag}-lighthouse.md"
    text = f"The {tag} lighthouse keeper sounds the foghorn every ninety seconds when the fog rolls in."
    ingested = _json(await client.call_tool("ingest_text", {
        "text": text, "source_uri": uri, "title": "Lighthouse", "collection": "kb", "tags": ["coast"],
        "wait_s": 60}))
    assert ingested["status"] == "succeeded", ingested
    assert ingested["report"]["documents"]["added"] == 1 and ingested["status_url"] == f"/v1/jobs/{ingested['job_id']}"
    stored = await _read(client, f"ragsvc://documents/{ingested['document_id']}")
    assert stored["source_uri"] == uri and stored["tags"] == ["coast"] and stored["chunks"][0]["text"] == text
    hits = _json(await client.call_tool("search", {"query": f"{tag} lighthouse foghorn", "collection": "kb"}))
    assert hits["results"][0]["document_id"] == ingested["document_id"]

    unknown = _error(await client.call_tool("ask", {"question": "What raises the tides?", "collection": "nope"}))
    assert "not found" in unknown and "collection 'nope' does not exist" in unknown
    invalid = _error(await client.call_tool("search", {"query": "tides", "top_k": 0}))
    assert "top_k" in invalid
    with pytest.raises(MCPError, match="no document"):
        await client.read_resource("ragsvc://documents/not-a-uuid")


async def test_over_streamable_http(base: str, keys: dict[str, str]) -> None:
    async with over_http(base, keys["ingester"]) as client:
        await exercise(client, "http")
    # The request monitor saw the MCP requests under their route, with an id on each response.
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        response = await http.post("/mcp", headers={**ACCEPT, **bearer(keys["reader"])}, json=PING)
        assert response.status_code == 200 and response.json()["result"] == {}, response.text
        assert response.headers["x-request-id"]
        # Stateless: no server-initiated stream to open, no session to end.
        assert (await http.get("/mcp", headers={**ACCEPT, **bearer(keys["reader"])})).status_code == 405
        scraped = (await http.get("/metrics", headers=bearer(keys["monitor"]))).text
    assert _series(scraped, "ragsvc_http_request_duration_seconds_count", method="POST", route="/mcp",
                   status="200") >= 10
    assert _series(scraped, "ragsvc_http_request_duration_seconds_count", method="GET", route="/mcp",
                   status="405") == 1


async def test_http_needs_a_key_and_each_tool_its_role(base: str, keys: dict[str, str]) -> None:
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        anonymous = await http.post("/mcp", headers=ACCEPT, json=PING)
        unknown = await http.post("/mcp", headers={**ACCEPT, **bearer("rsk_unknown")}, json=PING)
    assert anonymous.status_code == 401 and anonymous.headers["www-authenticate"] == "Bearer"
    refused = anonymous.json()["error"]
    assert "Authorization: Bearer" in refused["message"] and refused["data"]["status"] == 401
    assert unknown.status_code == 401 and "unknown or revoked" in unknown.json()["error"]["message"]
    # The SDK's client shows the reason (wrapped in its task groups' exception groups).
    with pytest.RaisesGroup(pytest.RaisesExc(MCPError, match="needs an API key"), flatten_subgroups=True):
        async with over_http(base, None) as client:
            await client.list_tools()

    async with over_http(base, keys["reader"]) as client:
        assert _json(await client.call_tool("list_collections", {}))["count"] >= 1
        denied = _error(await client.call_tool("ingest_text", {"text": "x", "source_uri": "x.md"}))
        assert "ingester role" in denied and "this key is a reader key" in denied
        assert "ragsvc keys create --role ingester" in denied
    async with over_http(base, keys["monitor"]) as client:
        assert "reader role" in _error(await client.call_tool("list_collections", {}))
        with pytest.raises(MCPError, match="reader role"):
            await client.read_resource("ragsvc://collections")
    async with over_http(base, keys["admin"]) as client:
        private = _json(await client.call_tool("ingest_text", {
            "text": "Salary bands are reviewed every March.", "source_uri": "bands.md", "collection": "private",
            "acl": ["hr"], "wait_s": 60}))
        assert private["status"] == "succeeded", private
    # A collection lists the documents the key's principals may read.
    for key, visible in (("reader", 0), ("hr-reader", 1)):
        async with over_http(base, keys[key]) as client:
            listed = {c["name"]: c["documents"] for c in _json(await client.call_tool("list_collections", {}))["data"]}
            assert listed["private"] == visible, (key, listed)
            if not visible:
                with pytest.raises(MCPError, match="no document"):
                    await client.read_resource(f"ragsvc://documents/{private['document_id']}")
    async with over_http(base, keys["other-reader"]) as client:  # a key limited to the collection "other"
        assert _json(await client.call_tool("list_collections", {}))["data"] == []
        outside = _error(await client.call_tool("search", {"query": "tides", "collection": "kb"}))
        assert "may only use the collections other" in outside
        # Outside its scope, a collection that exists and one that does not look the same.
        for name in ("kb", "no-such-collection"):
            with pytest.raises(MCPError, match="may only use the collections other"):
                await client.read_resource(f"ragsvc://collections/{name}/documents")


async def test_over_stdio(base: str, migrated_url: str, data_dir: Path, tmp_path: Path) -> None:
    # `base` first: the app has ingested the small KB (its worker may also run this process's jobs).
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAGSVC_")}
    env.update(RAGSVC_DATABASE_URL=migrated_url, RAGSVC_DATA_DIR=str(data_dir), RAGSVC_SERVE_WORKER="on",
               RAGSVC_EXPERIMENT_CHECK_S="0")
    errors = tmp_path / "stderr.log"
    with errors.open("w") as errlog:
        server = StdioServerParameters(command=RAGSVC, args=["mcp"], env=env)
        async with Client(stdio_client(server, errlog=errlog)) as client:
            await exercise(client, "stdio")
    logged = errors.read_text()
    # The logs went to stderr (the protocol had stdout to itself, or the client would have failed).
    assert '"logger"' in logged and "Traceback" not in logged, logged[-2000:]


def test_stdio_start_up_errors_are_one_clear_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAGSVC_")}
    env.update(RAGSVC_DATABASE_URL="postgresql://u:secret@127.0.0.1:1/x", RAGSVC_DATA_DIR=str(tmp_path))
    result = subprocess.run([RAGSVC, "mcp"], env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 4 and result.stdout == ""  # stdout stays the protocol's
    assert "cannot reach PostgreSQL" in result.stderr and "Traceback" not in result.stderr
    assert "secret" not in result.stderr
