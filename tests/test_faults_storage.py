"""Faults of storage and of the embedded database's data dir.

- The database's disk full, or its file system read-only, under a running service: an upload gets a
  clear 507/503 naming the storage problem and what to do, nothing is acknowledged that was not stored,
  no row is half-written, and the service works again once the condition is gone. The database lives
  in a tablespace on a small tmpfs of its own (mounted here, as root), on a PostgreSQL server of its own,
  so PostgreSQL meets a real ENOSPC / EROFS from the kernel while its WAL and catalogs stay writable.

The data dir's faults at start-up are in test_faults_data_dir.py; the volume helpers here serve both.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import random
import shutil
import string
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from subprocess import CompletedProcess

import psycopg
import pytest
from fastapi.testclient import TestClient
from psycopg import sql

from ingestion.jobs import options_to_params, run_job
from ingestion.pipeline import IngestOptions
from rag_service.api import create_app
from rag_service.config import load_settings
from rag_service.db import migrate
from rag_service.db.engine import storage_error
from rag_service.domain import Upload
from rag_service.errors import StorageFullError, StorageNotWritableError
from tests.apps import client_with_documents, wait_for_job
from tests.conftest import EXTERNAL_DATABASE_URL, scratch_dir

needs_embedded = pytest.mark.skipif(EXTERNAL_DATABASE_URL is not None,
                                    reason="runs PostgreSQL servers of its own: embedded (pgserver) only")

# The tables an upload writes (and the queue's), and those ingestion writes.
WRITTEN_TABLES = ("ingest_jobs", "ingest_uploads", "procrastinate_jobs", "documents", "chunks")


RAGSVC = str(Path(sys.executable).parent / "ragsvc")


def ragsvc(data_dir: Path, *args: str, wait_s: float | None = None, timeout_s: float = 90,
           database_url: str | None = None) -> CompletedProcess:
    """The ``ragsvc`` command in a process of its own on ``data_dir`` (its exit stops the embedded server)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAGSVC_")}
    env["RAGSVC_DATA_DIR"] = str(data_dir)
    if database_url is not None:
        env["RAGSVC_DATABASE_URL"] = database_url
    if wait_s is not None:
        env["RAGSVC_EMBEDDED_START_WAIT_S"] = str(wait_s)
    return subprocess.run([RAGSVC, *args], env=env, capture_output=True, text=True, timeout=timeout_s)


def one_clear_line(result: CompletedProcess, *words: str) -> str:
    """The command failed with exit code 4 and said why in one line (no traceback) holding ``words``."""
    assert result.returncode == 4, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error")]
    assert len(errors) == 1, result.stderr
    for word in words:
        assert word in errors[0], errors[0]
    return errors[0]


def mount_tmpfs(path: Path, size_mb: int) -> None:
    """A small file system of its own at ``path``, or a skip saying why this machine cannot."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs to fill or make read-only needs root")
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0755", "ragsvc-test", str(path)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (no CAP_SYS_ADMIN in this container?): {mounted.stderr.strip()}")


def unmount(path: Path) -> None:
    if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def remount(path: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(path)], check=True, capture_output=True, text=True)


def fill(volume: Path) -> Path:
    """Fill the file system at ``volume`` to the last byte with a file of root's."""
    filler = volume / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (1 << 20, 1 << 12):
            block = b"\0" * size
            try:
                while True:
                    os.write(fd, block)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)
    assert shutil.disk_usage(volume).free < 1 << 12
    return filler


@dataclass
class SmallVolume:
    """The service's database, placed whole (catalogs, tables, TOAST, indexes) on a small tmpfs."""

    path: Path
    url: str  # SQLAlchemy URL of the service's database
    conninfo: str  # libpq, for looking at the tables from outside the service
    admin: str  # libpq, the maintenance database

    def counts(self) -> dict[str, int]:
        with psycopg.connect(self.conninfo) as conn:
            return {t: conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(t))).fetchone()[0]
                    for t in WRITTEN_TABLES}

    @contextlib.contextmanager
    def full(self) -> Iterator[None]:
        filler = fill(self.path)
        try:
            yield
        finally:
            filler.unlink()

    @contextlib.contextmanager
    def read_only(self) -> Iterator[None]:
        # Linux refuses to remount a file system read-only while a file on it is open for writing
        # (EBUSY), and PostgreSQL's backends keep theirs open: the database's sessions are ended,
        # with new ones held off for the moment of the remount (the service's pools reconnect at once).
        with psycopg.connect(self.admin, autocommit=True) as conn:
            conn.execute("ALTER DATABASE ragsvc_small ALLOW_CONNECTIONS false")
            try:
                deadline = time.monotonic() + 10
                while True:
                    conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                 "WHERE datname = 'ragsvc_small' AND pid <> pg_backend_pid()")
                    done = subprocess.run(["mount", "-o", "remount,ro", str(self.path)], capture_output=True,
                                          text=True)
                    if done.returncode == 0:
                        break
                    assert time.monotonic() < deadline, f"could not remount {self.path} read-only: {done.stderr}"
                    time.sleep(0.05)
            finally:
                conn.execute("ALTER DATABASE ragsvc_small ALLOW_CONNECTIONS true")
        try:
            yield
        finally:
            remount(self.path, "rw")


def test_storage_errors_are_told_apart_from_grants_outages_and_bugs() -> None:
    url = "postgresql+psycopg://u@db/x"
    full = storage_error(psycopg.errors.DiskFull('could not extend file "base/5/16390": No space left on device\n'
                                                 "HINT:  Check free disk space."), url, Path("/srv/data/pg"))
    assert isinstance(full, StorageFullError) and full.status_code == 507 and full.exit_code == 4
    assert "HINT" not in str(full) and "/srv/data/pg" in str(full) and "\n" not in str(full)
    read_only = storage_error(psycopg.errors.InsufficientPrivilege(
        'could not open file "base/5/2601": Read-only file system'), url)
    assert type(read_only) is StorageNotWritableError and read_only.status_code == 503 and url in str(read_only)
    at_connect = storage_error(psycopg.OperationalError(
        'connection failed: connection to server on socket "/s/.s.PGSQL.5432" failed: FATAL:  could not open '
        'file "global/pg_filenode.map": Permission denied'), url)
    assert type(at_connect) is StorageNotWritableError and "Permission denied" in str(at_connect)
    # A missing grant, a server that is down, a bug: not storage.
    assert storage_error(psycopg.errors.InsufficientPrivilege("permission denied for table documents"), url) is None
    assert storage_error(psycopg.OperationalError("connection refused"), url) is None
    assert storage_error(ValueError("No space in the plan"), url) is None


@pytest.fixture(scope="module")
def volume() -> Iterator[SmallVolume]:
    if EXTERNAL_DATABASE_URL is not None:
        pytest.skip("runs a PostgreSQL server of its own: embedded (pgserver) only")
    import pgserver

    root = scratch_dir("ragsvc-storage-")
    with contextlib.ExitStack() as undo:
        undo.callback(shutil.rmtree, root, ignore_errors=True)
        mount_tmpfs(root / "vol", 48)
        undo.callback(unmount, root / "vol")
        server = pgserver.get_server(root / "pg", cleanup_mode="delete")
        undo.callback(server.cleanup)  # before the unmount: the server has files open there
        owner = pwd.getpwnam("pgserver")  # as root pgserver runs PostgreSQL as this user
        location = root / "vol" / "pg"
        location.mkdir()
        os.chown(location, owner.pw_uid, owner.pw_gid)
        admin = server.get_uri("postgres")
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE TABLESPACE small LOCATION {}").format(sql.Literal(str(location))))
            conn.execute("CREATE DATABASE ragsvc_small TABLESPACE small")
        conninfo = server.get_uri("ragsvc_small")
        url = conninfo.replace("postgresql://", "postgresql+psycopg://", 1)
        migrate.upgrade(url, load_settings(database_url=url))
        yield SmallVolume(root / "vol", url, conninfo, admin)


@pytest.fixture(scope="module")
def client(volume: SmallVolume) -> Iterator[TestClient]:
    yield from client_with_documents(volume.url)


def noise(n_bytes: int, seed: int) -> str:
    """Text that does not compress (as most real files): PostgreSQL must find new pages to store it."""
    rng = random.Random(seed)
    words = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 10))) for _ in range(n_bytes // 6)]
    return " ".join(words)[:n_bytes] + "."


def upload(name: str, seed: int) -> dict:
    return {"source_uri": name, "collection": "kb", "text": noise(120_000, seed)}


def assert_storage_problem(response, status: int, *words: str) -> str:  # noqa: ANN001 - httpx.Response
    assert response.status_code == status, response.text
    problem = response.json()
    assert problem["status"] == status and "Traceback" not in problem["detail"]
    for word in words:
        assert word in problem["detail"], problem["detail"]
    return problem["detail"]


@needs_embedded
def test_disk_full_upload_is_a_clear_507_nothing_half_written_and_recovers(client: TestClient,
                                                                          volume: SmallVolume) -> None:
    before = volume.counts()
    question = {"question": "What raises the ocean tides?", "collection": "kb"}
    with volume.full():
        detail = assert_storage_problem(client.post("/v1/documents", json=upload("moon.md", 1)), 507,
                                        "disk is full", "No space left on device", "Free disk space", "retry")
        assert "cannot reach" not in detail  # before: "database unavailable: cannot reach PostgreSQL at ..."
        as_file = client.post("/v1/documents", files=[("files", ("sun.txt", noise(120_000, 2).encode(), "text/plain"))],
                              data={"collection": "kb"})
        assert_storage_problem(as_file, 507, "disk is full")
        assert as_file.json()["title"] == "insufficient storage"
        # Reads go on: the answer is given, only its log could not be written.
        answer = client.post("/v1/query", json=question)
        assert answer.status_code == 200 and answer.json()["citations"][0]["source_uri"] == "tides.md"
        assert next(s for s in answer.json()["steps"] if s["kind"] == "persist")["status"] == "failed"
        # Nothing acknowledged, nothing half-written: no job, upload, queue entry, document or chunk.
        assert volume.counts() == before
    accepted = client.post("/v1/documents", json={**upload("moon.md", 1), "text": noise(2_000, 1)})
    assert accepted.status_code == 202, accepted.text
    assert wait_for_job(client.get, accepted.json()["status_url"])["status"] == "succeeded"
    again = client.post("/v1/query", json=question).json()
    assert next(s for s in again["steps"] if s["kind"] == "persist")["status"] == "ok"


@needs_embedded
def test_disk_full_during_ingestion_fails_the_job_clearly_without_partial_documents(client: TestClient,
                                                                                   volume: SmallVolume) -> None:
    runtime = client.app.state.runtime
    uploads = [Upload(source_uri=f"noise-{i}.txt", filename="inline.txt", content=noise(4_000, 10 + i).encode())
               for i in range(3)]
    # Accepted before the disk filled; created but not queued (the module's worker would take it at
    # once), and run below as a worker runs it. One document a transaction.
    job_id = client.portal.call(runtime.jobs.create, "kb",
                                options_to_params(IngestOptions(collection="kb", batch_documents=1)), uploads)
    before = volume.counts()
    with volume.full():
        failed = client.portal.call(run_job, job_id, runtime.jobs, runtime.ingestor)
        # before: the raw psycopg DiskFull escaped the worker ("internal error: DiskFull: ...")
        assert failed.status == "failed" and failed.error.startswith("the database's disk is full"), failed.error
        after = volume.counts()
    assert (after["documents"], after["chunks"]) == (before["documents"], before["chunks"])
    assert after["ingest_uploads"] == before["ingest_uploads"] == 3  # kept for another attempt
    done = client.portal.call(run_job, job_id, runtime.jobs, runtime.ingestor)
    assert done.status == "succeeded" and done.report["documents"]["added"] == 3
    with psycopg.connect(volume.conninfo) as conn:
        chunkless = conn.execute("SELECT count(*) FROM documents d WHERE NOT EXISTS "
                                 "(SELECT 1 FROM chunks c WHERE c.document_id = d.id)").fetchone()[0]
    assert chunkless == 0


@needs_embedded
def test_read_only_storage_is_a_clear_503_nothing_written_and_recovers(client: TestClient,
                                                                      volume: SmallVolume) -> None:
    before = volume.counts()
    question = {"question": "What raises the ocean tides?", "collection": "kb"}
    with volume.read_only():
        # before: 503 "database unavailable: cannot reach PostgreSQL at ...: connection failed: ... FATAL: could not
        # open file ...: Read-only file system"
        refused = client.post("/v1/documents", json=upload("mars.md", 3))
        detail = assert_storage_problem(refused, 503, "cannot write its files", "Read-only file system",
                                        "writable again")
        assert refused.json()["title"] == "database storage not writable" and "cannot reach" not in detail
        assert_storage_problem(client.post("/v1/query", json=question), 503, "Read-only file system")
        ready = client.get("/readyz")
        assert ready.status_code == 503 and "Read-only file system" in ready.json()["checks"]["database"]
    assert volume.counts() == before
    deadline = time.monotonic() + 30
    while (again := client.post("/v1/query", json=question)).status_code != 200:
        assert time.monotonic() < deadline, again.text
        time.sleep(0.2)
    accepted = client.post("/v1/documents", json={**upload("mars.md", 3), "text": noise(2_000, 3)})
    assert accepted.status_code == 202, accepted.text
    assert wait_for_job(client.get, accepted.json()["status_url"])["status"] == "succeeded"


@needs_embedded
def test_cli_ingest_on_a_full_disk_is_one_clear_line_and_stores_nothing(volume: SmallVolume, local_embedder,  # noqa: ANN001
                                                                       model_cache: Path, tmp_path: Path) -> None:
    data_dir = scratch_dir("ragsvc-cli-data-")
    (data_dir / "models").symlink_to(model_cache)  # the session's exported model, not a new export
    document = tmp_path / "notes.md"
    document.write_text(noise(3_000, 7))
    before = volume.counts()
    try:
        with volume.full():
            result = ragsvc(data_dir, "ingest", str(document), "-c", "kb", database_url=volume.url)
        # before: "error: cannot reach PostgreSQL at ...: could not extend file ...: No space left on device",
        # then PostgreSQL's HINT on a line of its own
        one_clear_line(result, "disk is full", "No space left on device", "Free disk space")
        assert volume.counts() == before
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture
def queue_on_small_volume(volume: SmallVolume) -> Iterator[str]:
    """A database on the big disk whose job queue (procrastinate's tables, empty) is on the small
    volume: a job row can be stored when the queue's cannot."""
    with psycopg.connect(volume.admin, autocommit=True) as conn:
        conn.execute("CREATE DATABASE ragsvc_queue")
    conninfo = volume.admin.replace("/postgres?", "/ragsvc_queue?")
    url = conninfo.replace("postgresql://", "postgresql+psycopg://", 1)
    migrate.upgrade(url, load_settings(database_url=url))
    with psycopg.connect(conninfo, autocommit=True) as conn:
        for table in ("procrastinate_jobs", "procrastinate_events"):
            conn.execute(sql.SQL("ALTER TABLE {} SET TABLESPACE small").format(sql.Identifier(table)))
            for (index,) in conn.execute("SELECT indexname FROM pg_indexes WHERE tablename = %s", (table,)):
                conn.execute(sql.SQL("ALTER INDEX {} SET TABLESPACE small").format(sql.Identifier(index)))
    yield url
    with psycopg.connect(volume.admin, autocommit=True) as conn:
        conn.execute("DROP DATABASE ragsvc_queue WITH (FORCE)")


@needs_embedded
def test_a_job_the_full_queue_cannot_take_is_refused_and_leaves_nothing(volume: SmallVolume,
                                                                       queue_on_small_volume: str) -> None:
    settings = load_settings(database_url=queue_on_small_volume, serve_worker="off")
    conninfo = queue_on_small_volume.replace("postgresql+psycopg://", "postgresql://", 1)
    with TestClient(create_app(settings)) as client, volume.full():
        refused = client.post("/v1/documents", json=upload("venus.md", 4))
        # before: 500 "an unexpected error occurred" (procrastinate's ConnectorException), and a job
        # row marked failed with its uploads kept, which nobody had the id of
        assert_storage_problem(refused, 507, "disk is full", "No space left on device")
        with psycopg.connect(conninfo) as conn:
            left = [conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(t))).fetchone()[0]
                    for t in ("ingest_jobs", "ingest_uploads", "procrastinate_jobs")]
        assert left == [0, 0, 0]


# --- the embedded database's data dir: full, read-only, held by another process ---------------------------
