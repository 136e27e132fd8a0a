"""``ragsvc keys create|list|revoke`` and ``ragsvc serve``'s refusal to listen beyond this machine
without a key."""

from __future__ import annotations

import json
import subprocess
import time

import httpx
import pytest
from typer.testing import CliRunner

from rag_service.cli import app
from tests.test_cli import RAGSVC, _env, _free_port, _stop


@pytest.fixture
def keys_db(databases, monkeypatch: pytest.MonkeyPatch) -> str:
    url = databases.create()
    monkeypatch.setenv("RAGSVC_DATABASE_URL", url)
    return url


def _invoke(*args: str):
    result = CliRunner().invoke(app, list(args))
    return result


def test_create_prints_the_key_once_then_list_and_revoke(keys_db: str) -> None:
    created = _invoke("keys", "create", "--role", "reader", "--principal", "legal", "--principal", "hr",
                      "--collection", "kb", "--name", "bot", "--json")
    assert created.exit_code == 0, created.output
    payload = json.loads(created.stdout)
    key = payload["key"]
    assert key.startswith("rsk_") and payload["prefix"] == key[:12]
    assert {k: payload[k] for k in ("role", "principals", "collections", "name")} == {
        "role": "reader", "principals": ["legal", "hr"], "collections": ["kb"], "name": "bot"}

    plain = _invoke("keys", "create", "--role", "admin")
    assert plain.exit_code == 0, plain.output
    admin_key = plain.stdout.strip()
    assert admin_key.startswith("rsk_") and len(admin_key.splitlines()) == 1

    listed = _invoke("keys", "list", "--json")
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.stdout)
    assert rows["count"] == 2 and key not in listed.stdout and admin_key not in listed.stdout
    assert {r["prefix"] for r in rows["data"]} == {key[:12], admin_key[:12]}
    assert not any(r["revoked"] for r in rows["data"])

    revoked = _invoke("keys", "revoke", key[:12], "--json")
    assert revoked.exit_code == 0, revoked.output
    assert json.loads(revoked.stdout)["id"] == payload["id"]
    table = _invoke("keys", "list")
    assert table.exit_code == 0 and "revoked" in table.stdout and "active" in table.stdout
    after = {r["id"]: r["revoked"] for r in json.loads(_invoke("keys", "list", "--json").stdout)["data"]}
    assert after[payload["id"]] is True


def test_bad_input_is_one_clear_line(keys_db: str) -> None:
    wrong_role = _invoke("keys", "create", "--role", "owner")
    assert wrong_role.exit_code == 2 and "reader, ingester, reviewer, admin" in wrong_role.output
    unknown = _invoke("keys", "revoke", "rsk_nothing")
    assert unknown.exit_code == 3 and "ragsvc keys list" in unknown.output
    star = _invoke("keys", "create", "--role", "reader", "--principal", "*")
    assert star.exit_code == 2 and "principals" in star.output


def test_serve_refuses_a_public_address_until_a_key_exists(databases) -> None:
    url = databases.create()
    port = _free_port()
    command = [RAGSVC, "serve", "--host", "0.0.0.0", "--port", str(port)]  # noqa: S104
    refused = subprocess.run(command, env=_env(RAGSVC_DATABASE_URL=url), capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2, refused.stderr
    assert "ragsvc keys create --role admin" in refused.stderr and "Traceback" not in refused.stderr

    created = subprocess.run([RAGSVC, "keys", "create", "--role", "reader", "--json"],
                             env=_env(RAGSVC_DATABASE_URL=url), capture_output=True, text=True, timeout=120)
    assert created.returncode == 0, created.stderr
    key = json.loads(created.stdout)["key"]
    proc = subprocess.Popen(command, env=_env(RAGSVC_DATABASE_URL=url), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stderr.read()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "ragsvc serve did not start"
            time.sleep(0.2)
        anonymous = httpx.get(f"http://127.0.0.1:{port}/v1/documents", timeout=10)
        assert anonymous.status_code == 401 and anonymous.headers["www-authenticate"] == "Bearer"
        allowed = httpx.get(f"http://127.0.0.1:{port}/v1/documents", timeout=10,
                            headers={"Authorization": f"Bearer {key}"})
        assert allowed.status_code == 200, allowed.text
    finally:
        _stop(proc)
