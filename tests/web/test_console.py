"""The reviewer console at /review: sign-in and sessions, CSRF, roles (TestClient), and the pure
markup and chart helpers. The whole flow in a real browser is in test_console_browser.py."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from rag_service.api import create_app
from rag_service.db.engine import Database
from rag_service.domain import Caller
from rag_service.domain.prompts import NewVersionRequest
from rag_service.web.charts import Series, histogram_svg
from rag_service.web.markup import highlighted, linked_answer, spans
from tests.web.conftest import (
    PROMPT,
    QUOTE,
    console_settings,
    create_key,
    revoke_key,
    seed_review_item,
)

CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')
CORRECTED_PROMPT = "[system]\nAnswer briefly, quoting the passage.\n[user]\n{{ question }}"


# --- pure helpers --------------------------------------------------------------------------------


def test_answer_markers_link_to_the_passages_read() -> None:
    html = linked_answer("See [1] and [3] <b>", passages={1})
    assert '<a href="#chunk-1" class="cite" aria-label="citation 1">[1]</a>' in html
    assert "[3]" in html and "#chunk-3" not in html  # no passage 3 was read: no dead link
    assert "&lt;b&gt;" in html


def test_cited_spans_are_marked_and_the_rest_escaped() -> None:
    assert spans("abc abc", ["bc", "c a", "zz"]) == [(1, 3)]  # overlap dropped, missing quote ignored
    html = highlighted("<p> Reset it. & more", ["Reset it."])
    assert html == "&lt;p&gt; <mark>Reset it.</mark> &amp; more"
    assert highlighted("nothing cited", ["elsewhere"]) == "nothing cited"


def test_the_histogram_is_an_accessible_svg() -> None:
    svg = histogram_svg([Series("control (v1)", [0] * 7 + [5, 10, 5]), Series("candidate <v2>", [0] * 8 + [10, 10])],
                        title="Scores")
    assert svg.startswith("<svg") and 'role="img"' in svg and '<title id="chart-title">Scores</title>' in svg
    assert svg.count("<rect") == 2 * 10 + 2  # bars and legend swatches
    assert "candidate &lt;v2&gt;" in svg and "<v2>" not in svg


# --- sessions, CSRF and roles (TestClient) -------------------------------------------------------


@pytest.fixture(scope="module")
def keys(migrated_url: str) -> dict[str, str]:
    return {role: create_key(migrated_url, role, f"console-{role}") for role in ("reader", "reviewer", "admin")}


@pytest.fixture(scope="module")
def client(migrated_url: str, console_data_dir: Path, keys: dict[str, str]) -> Iterator[TestClient]:
    app = create_app(console_settings(migrated_url, console_data_dir))
    with TestClient(app, follow_redirects=False) as test_client:
        yield test_client


def sign_in(client: TestClient, key: str) -> str:
    """Sign in (dropping any earlier session cookie); returns the session's CSRF token."""
    client.cookies.clear()
    response = client.post("/review/login", data={"api_key": key})
    assert response.status_code == 303 and response.headers["location"] == "/review", response.text
    page = client.get("/review")
    assert page.status_code == 200
    match = CSRF.search(page.text)
    assert match is not None
    return match.group(1)


def test_pages_without_a_session_go_to_sign_in(client: TestClient) -> None:
    client.cookies.clear()
    for path in ("/review", "/review/prompts", "/review/experiments", f"/review/items/{uuid.uuid4()}",
                 f"/review/experiments/{uuid.uuid4()}"):
        response = client.get(path)
        assert (response.status_code, response.headers.get("location")) == (303, "/review/login"), path
    response = client.post(f"/review/items/{uuid.uuid4()}/claim", data={"csrf_token": "x"})
    assert (response.status_code, response.headers.get("location")) == (303, "/review/login")
    client.cookies.set("ragsvc_console", "made-up", path="/review")
    assert client.get("/review").status_code == 303
    login = client.get("/review/login")
    assert login.status_code == 200 and '<label for="api_key">' in login.text and 'lang="en"' in login.text


def test_only_reviewer_and_admin_keys_sign_in(client: TestClient, keys: dict[str, str]) -> None:
    client.cookies.clear()
    refused = client.post("/review/login", data={"api_key": keys["reader"]})
    assert refused.status_code == 403 and "reviewer or admin" in refused.text
    assert "set-cookie" not in refused.headers
    unknown = client.post("/review/login", data={"api_key": "rsk_" + "x" * 43})
    assert unknown.status_code == 401 and "unknown or revoked" in unknown.text
    accepted = client.post("/review/login", data={"api_key": keys["reviewer"]})
    assert accepted.status_code == 303
    cookie = accepted.headers["set-cookie"]
    assert cookie.startswith("ragsvc_console=") and "HttpOnly" in cookie and "Path=/review" in cookie
    assert "samesite=strict" in cookie.lower() and "Secure" not in cookie  # plain http here
    assert keys["reviewer"] not in cookie  # the cookie is a session token, never the key


def test_form_posts_need_the_sessions_csrf_token(client: TestClient, keys: dict[str, str]) -> None:
    csrf = sign_in(client, keys["reviewer"])
    for data in ({}, {"csrf_token": "wrong"}, {"csrf_token": csrf[:-1]}):
        response = client.post("/review/logout", data=data)
        assert response.status_code == 403 and "security token" in response.text, data
    assert client.get("/review").status_code == 200  # still signed in
    signed_out = client.post("/review/logout", data={"csrf_token": csrf})
    assert (signed_out.status_code, signed_out.headers["location"]) == (303, "/review/login")
    assert client.get("/review").status_code == 303


def test_a_revoked_keys_session_stops_working(client: TestClient, migrated_url: str) -> None:
    key = create_key(migrated_url, "reviewer", "soon-revoked")
    sign_in(client, key)
    assert client.get("/review/prompts").status_code == 200
    revoke_key(migrated_url, key)
    response = client.get("/review/prompts")
    assert (response.status_code, response.headers["location"]) == (303, "/review/login")


def test_expired_and_signed_out_sessions_are_gone(client: TestClient, keys: dict[str, str]) -> None:
    csrf = sign_in(client, keys["reviewer"])
    token = client.cookies.get("ragsvc_console")
    assert client.post("/review/logout", data={"csrf_token": csrf}).status_code == 303
    client.cookies.set("ragsvc_console", token, path="/review")  # the old cookie, kept by a careless browser
    assert client.get("/review").status_code == 303

    sign_in(client, keys["reviewer"])
    client.portal.call(expire_sessions, client.app.state.runtime.db)
    assert client.get("/review").status_code == 303


async def expire_sessions(db: Database) -> None:
    async with db.begin() as conn:
        await conn.execute(text("UPDATE console_sessions SET expires_at = now() - interval '1 second'"))


def test_the_queue_filters_and_pages(client: TestClient, keys: dict[str, str]) -> None:
    for n in range(3):
        client.portal.call(seed_review_item, client.app.state.runtime.db, f"Paged question {n}?", f"paging test {n}")
    sign_in(client, keys["reviewer"])
    first = client.get("/review?reason=PAGING+TEST&limit=2")  # the reason filter is a case-insensitive substring
    assert first.status_code == 200 and first.text.count("Paged question") == 2 and "of 3" in first.text
    assert "Previous page" not in first.text and "offset=2" in first.text
    last = client.get("/review?reason=paging+test&limit=2&offset=2")
    assert last.text.count("Paged question") == 1
    assert "Previous page" in last.text and "offset=0" in last.text and "Next page" not in last.text
    assert "No items match" in client.get("/review?reason=no-such-reason").text
    assert "No items match" in client.get("/review?metric=freshness").text
    assert client.get("/review?status=bogus").status_code == 422


def test_a_reviewer_may_not_run_the_admin_actions(client: TestClient, keys: dict[str, str]) -> None:
    csrf = sign_in(client, keys["reviewer"])
    for path in (f"/review/experiments/{uuid.uuid4()}/promote", f"/review/experiments/{uuid.uuid4()}/stop",
                 f"/review/prompts/{PROMPT}/rollback", "/review/experiments"):
        response = client.post(path, data={"csrf_token": csrf, "name": PROMPT})
        assert response.status_code == 403 and "only an admin" in response.text, path
    page = client.get("/review/experiments")
    assert page.status_code == 200 and "Start experiment" not in page.text
    assert "Roll back production" not in client.get(f"/review/prompts?name={PROMPT}").text
    assert client.get(f"/review/prompts?name={PROMPT}").status_code == 200


def test_an_invalid_decision_comes_back_with_the_form(client: TestClient, keys: dict[str, str]) -> None:
    review_id = client.portal.call(seed_review_item, client.app.state.runtime.db, "Where is the reset link sent?")
    csrf = sign_in(client, keys["reviewer"])
    page = client.get(f"/review/items/{review_id}")
    assert page.status_code == 200
    assert '<a href="#chunk-1" class="cite" aria-label="citation 1">[1]</a>' in page.text
    assert f"<mark>{QUOTE}</mark>" in page.text and 'id="chunk-1"' in page.text
    assert client.post(f"/review/items/{review_id}/claim", data={"csrf_token": csrf}).status_code == 303

    form = {"csrf_token": csrf, "decision": "rejected", "category": "routing", "feedback": "kept when refused",
            "corrected_routing": "{not json"}
    response = client.post(f"/review/items/{review_id}/decision", data=form)
    assert response.status_code == 422 and "not valid JSON" in response.text and "kept when refused" in response.text
    response = client.post(f"/review/items/{review_id}/decision", data={
        **form, "corrected_routing": "", "corrected_prompt": "[system]\n{% if %}"})
    assert response.status_code == 422 and "corrected prompt" in response.text
    response = client.post(f"/review/items/{review_id}/decision", data={**form, "corrected_routing": "",
                                                                        "decision": "edited"})
    assert response.status_code == 422 and "corrected_answer is required" in response.text
    assert "Record decision" in client.get(f"/review/items/{review_id}").text  # nothing was recorded

    done = client.post(f"/review/items/{review_id}/decision", data={**form, "corrected_routing": ""})
    assert done.status_code == 303 and "done=1" in done.headers["location"]
    assert "Decision recorded: rejected (routing)" in client.get(done.headers["location"]).text
    assert client.get("/review/items/not-a-uuid").status_code == 422


def test_an_admin_promotes_by_force_only_and_can_roll_back(client: TestClient, keys: dict[str, str]) -> None:
    runtime = client.app.state.runtime
    client.portal.call(runtime.prompts.create, Caller(role="admin"), "prompt", PROMPT,
                       NewVersionRequest(body=CORRECTED_PROMPT, label="candidate", note="for the admin test"))
    csrf = sign_in(client, keys["admin"])
    form = {"csrf_token": csrf, "name": PROMPT, "control_label": "production", "candidate_label": "candidate",
            "share": "0.5"}
    started = client.post("/review/experiments", data=form)
    assert started.status_code == 303, started.text
    report = started.headers["location"].split("?")[0]
    again = client.post("/review/experiments", data=form)
    assert again.status_code == 409 and "already has a running experiment" in again.text
    assert client.post("/review/experiments", data={**form, "share": "1.5"}).status_code == 422

    refused = client.post(f"{report}/promote", data={"csrf_token": csrf})
    assert refused.status_code == 409 and "the candidate has not won" in refused.text
    assert 'name="force"' in refused.text
    forced = client.post(f"{report}/promote", data={"csrf_token": csrf, "force": "1", "reason": "demo"})
    assert forced.status_code == 303
    prompts = client.get(f"/review/prompts?name={PROMPT}").text
    assert "(forced)" in prompts and "demo" in prompts

    rolled = client.post(f"/review/prompts/{PROMPT}/rollback", data={"csrf_token": csrf, "reason": "undo"})
    assert rolled.status_code == 303
    assert "Production was rolled back to version 1" in client.get(rolled.headers["location"]).text
    assert client.portal.call(runtime.prompt_repository.labels, "prompt", PROMPT)["production"] == 1

    sign_in(client, keys["reviewer"])  # reviewers read the report, without the admin's buttons
    page = client.get(report)
    assert page.status_code == 200 and "<svg" in page.text and "Roll back production" not in page.text
    assert ">Promote</button>" not in page.text

