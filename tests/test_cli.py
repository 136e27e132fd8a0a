"""The ``ragsvc`` command as a user runs it: real processes, real (embedded) PostgreSQL."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from rag_service.cli import app
from rag_service.db.embedded import running_pid
from tests.conftest import scratch_dir

RAGSVC = str(Path(sys.executable).parent / "ragsvc")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAGSVC_")}
    env.update(values)
    return env


def _wait_ready(port: int, proc: subprocess.Popen, timeout_s: float = 120) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if proc.poll() is not None:
            raise AssertionError(f"ragsvc serve exited with {proc.returncode}: {proc.stderr.read()}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return time.monotonic() - started
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError("ragsvc serve did not become ready")


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_serve_becomes_ready_on_an_external_database(migrated_url: str) -> None:
    port = _free_port()
    proc = subprocess.Popen([RAGSVC, "serve", "--port", str(port)], env=_env(RAGSVC_DATABASE_URL=migrated_url),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seconds = _wait_ready(port, proc)
        assert seconds < 120
        assert httpx.get(f"http://127.0.0.1:{port}/healthz").json() == {"status": "ok"}
    finally:
        _stop(proc)
    assert proc.returncode == 0


@pytest.fixture
def scratch() -> Path:
    root = scratch_dir("ragsvc-cli-")
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
def test_second_process_shares_the_embedded_server_and_exit_stops_it(scratch: Path) -> None:
    data_dir = scratch / "data"
    env = _env(RAGSVC_DATA_DIR=str(data_dir))
    port = _free_port()
    serve = subprocess.Popen([RAGSVC, "serve", "--port", str(port)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_ready(port, serve)
        server_pid = running_pid(data_dir)
        assert server_pid is not None

        status = subprocess.run([RAGSVC, "status", "--json"], env=env, capture_output=True, text=True, timeout=120)
        assert status.returncode == 0, status.stderr
        info = json.loads(status.stdout)
        assert info["database"]["embedded"] is True
        assert info["database"]["pgvector_version"].startswith("0.")
        assert info["database"]["schema_revision"] == info["database"]["schema_head"]
        assert info["counts"] == {"collections": 0, "documents": 0, "chunks": 0, "embedded_chunks": 0}
        # The second process attached to the same server and left it running when it exited.
        assert running_pid(data_dir) == server_pid
        assert httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 200
    finally:
        _stop(serve)
    assert serve.returncode == 0
    deadline = time.monotonic() + 20
    while running_pid(data_dir) is not None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert running_pid(data_dir) is None, "the last process to exit must stop the embedded server"


def test_config_error_is_one_clear_line() -> None:
    result = subprocess.run([RAGSVC, "status"], env=_env(RAGSVC_PORT="nope"), capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2
    assert "RAGSVC_PORT" in result.stderr
    assert "Traceback" not in result.stderr


def test_unreachable_database_is_a_clear_error() -> None:
    port = _free_port()
    result = subprocess.run(
        [RAGSVC, "status", "--json"], env=_env(RAGSVC_DATABASE_URL=f"postgresql://u:pw@127.0.0.1:{port}/x"),
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 4, result.stderr
    assert "cannot reach PostgreSQL" in result.stderr
    assert "pw@" not in result.stderr and "Traceback" not in result.stderr


def test_db_downgrade_and_upgrade_print_json(databases, monkeypatch: pytest.MonkeyPatch) -> None:
    url = databases.create()
    monkeypatch.setenv("RAGSVC_DATABASE_URL", url)
    runner = CliRunner()
    down = runner.invoke(app, ["db", "downgrade", "base", "--json"])
    assert down.exit_code == 0, down.output
    assert json.loads(down.stdout)["revision"] is None
    up = runner.invoke(app, ["db", "upgrade", "--json"])
    assert up.exit_code == 0, up.output
    payload = json.loads(up.stdout)
    assert payload["revision"] == payload["head"] is not None


def test_db_half_index_builds_where_pgvector_has_halfvec_and_says_why_not_elsewhere(
        databases, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGSVC_DATABASE_URL", databases.create())
    runner = CliRunner()
    built = runner.invoke(app, ["db", "half-index", "--json"])
    if built.exit_code == 2:  # the embedded pgvector 0.6.2: a configuration error naming the version
        assert "needs pgvector 0.7 or later; this server has 0.6" in built.output, built.output
        assert "Traceback" not in built.output
        pytest.skip("building the half-precision index needs pgvector 0.7+")
    assert built.exit_code == 0, built.output
    assert json.loads(built.stdout)["built"] is True
    again = runner.invoke(app, ["db", "half-index", "--json"])
    assert json.loads(again.stdout)["built"] is False
    dropped = runner.invoke(app, ["db", "half-index", "--drop", "--json"])
    assert json.loads(dropped.stdout) == {"action": "drop", "dropped": True}


def test_help_lists_the_commands() -> None:
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("serve", "status", "db"):
        assert command in result.stdout


def test_db_upgrade_on_unreachable_database_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGSVC_DATABASE_URL", f"postgresql://u:pw@127.0.0.1:{_free_port()}/x")
    result = CliRunner().invoke(app, ["db", "upgrade"])
    assert result.exit_code == 4
    assert "cannot reach PostgreSQL" in result.output and "pw@" not in result.output


def test_db_upgrade_to_unknown_revision_is_a_clear_error(databases, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGSVC_DATABASE_URL", databases.create(migrated=False))
    result = CliRunner().invoke(app, ["db", "upgrade", "9999"])
    assert result.exit_code != 0
    assert "9999" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_serve_start_up_errors_are_one_clear_line() -> None:
    result = subprocess.run([RAGSVC, "serve", "--port", str(_free_port())],
                            env=_env(RAGSVC_EMBEDDING_MODEL="bge-large"), capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "RAGSVC_EMBEDDING_MODEL" in result.stderr and "Traceback" not in result.stderr


def test_serve_refuses_a_half_precision_index_it_does_not_have(databases) -> None:
    result = subprocess.run([RAGSVC, "serve", "--port", str(_free_port())],
                            env=_env(RAGSVC_DATABASE_URL=databases.create(), RAGSVC_VECTOR_INDEX="half"),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert ("pgvector 0.7 or later" in result.stderr or "ragsvc db half-index" in result.stderr), result.stderr
    assert "Traceback" not in result.stderr


def test_concurrent_first_starts_migrate_once(databases) -> None:
    """Two processes upgrading a fresh database at once: both succeed, the schema is created once."""
    url = databases.create(migrated=False)
    procs = [subprocess.Popen([RAGSVC, "db", "upgrade", "--json"], env=_env(RAGSVC_DATABASE_URL=url),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err for _, err in outputs]
    assert {json.loads(out)["revision"] for out, _ in outputs} == {json.loads(outputs[0][0])["head"]}
