"""Faults of storage and of the embedded database's data dir.

- The database's disk full, or its file system read-only, under a running service: an upload gets a
  clear 507/503 naming the storage problem and what to do, nothing is acknowledged that was not stored,
  no row is half-written, and the service works again once the condition is gone. The database lives
  in a tablespace on a small tmpfs of its own (mounted here, as root), on a PostgreSQL server of its own,
  so PostgreSQL meets a real ENOSPC / EROFS from the kernel while its WAL and catalogs stay writable.
- The data dir itself full or read-only when the embedded PostgreSQL has to start there.
- The data dir locked by another process: a postmaster.pid naming a live process that is not
  PostgreSQL, pgserver's start-up lock held by a stuck process. A clear one-line error naming the data
  dir, the other process and what to do, instead of a traceback, a hang, or a stranger's process killed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import random
import shutil
import signal
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
from rag_service.db.embedded import running_pid
from rag_service.db.engine import storage_error
from rag_service.domain import Upload
from rag_service.errors import StorageFullError, StorageNotWritableError
from tests.apps import client_with_documents
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


def wait_for_job(client: TestClient, status_url: str) -> dict:
    deadline = time.monotonic() + 60
    while (job := client.get(status_url).json())["status"] not in ("succeeded", "failed"):
        assert time.monotonic() < deadline, job
        time.sleep(0.2)
    return job


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
    assert wait_for_job(client, accepted.json()["status_url"])["status"] == "succeeded"
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
    assert wait_for_job(client, accepted.json()["status_url"])["status"] == "succeeded"


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

@pytest.fixture(scope="module")
def data_volume() -> Iterator[Path]:
    """An initialised, migrated data dir (no server running) alone on a 96 MB tmpfs."""
    if EXTERNAL_DATABASE_URL is not None:
        pytest.skip("tests the embedded database's data dir")
    root = scratch_dir("ragsvc-datadir-")
    try:
        mount_tmpfs(root / "vol", 96)
        data_dir = root / "vol" / "data"
        first = ragsvc(data_dir, "db", "upgrade")
        assert first.returncode == 0, first.stderr
        yield data_dir
    finally:
        unmount(root / "vol")
        shutil.rmtree(root, ignore_errors=True)


@needs_embedded
def test_a_full_data_dir_at_start_is_one_clear_line_and_starts_once_freed(data_volume: Path) -> None:
    with contextlib.ExitStack() as stack:
        filler = fill(data_volume.parent)
        stack.callback(filler.unlink)
        failed = ragsvc(data_volume, "db", "upgrade")
        # before: "could not start the embedded PostgreSQL in ...: Command [...pg_ctl...] returned non-zero
        # exit status 1. ... Set RAGSVC_DATA_DIR to a folder the current user can write", after pgserver's
        # dump of the command's output and the whole server log
        one_clear_line(failed, "disk that holds the data dir is full", str(data_volume / "pg"),
                       "No space left on device", "Free disk space")
    assert ragsvc(data_volume, "db", "upgrade").returncode == 0


@needs_embedded
def test_a_read_only_data_dir_at_start_is_one_clear_line_and_starts_once_writable(data_volume: Path) -> None:
    remount(data_volume.parent, "ro")
    try:
        failed = ragsvc(data_volume, "db", "upgrade")
        # before: "[Errno 30] Read-only file system: '.../data'. See the server log at ... Set RAGSVC_DATA_DIR to a
        # folder the current user can write (not under a mode-700 home when running as root) ..." over 5 lines
        one_clear_line(failed, "read-only file system", str(data_volume / "pg"), "Remount it read-write")
    finally:
        remount(data_volume.parent, "rw")
    assert ragsvc(data_volume, "db", "upgrade").returncode == 0


@pytest.fixture(scope="module")
def data_dir() -> Iterator[Path]:
    """An initialised, migrated data dir on the ordinary disk, no server running."""
    if EXTERNAL_DATABASE_URL is not None:
        pytest.skip("tests the embedded database's data dir")
    root = scratch_dir("ragsvc-locked-")
    first = ragsvc(root / "data", "db", "upgrade")
    assert first.returncode == 0, first.stderr
    yield root / "data"
    shutil.rmtree(root, ignore_errors=True)


@needs_embedded
def test_a_stale_postmaster_pid_naming_another_process_is_refused_and_that_process_spared(data_dir: Path) -> None:
    pgdata = data_dir / "pg"
    stranger = subprocess.Popen(["sleep", "60"])
    try:
        # What a server killed with the machine leaves behind, its pid since given to another process.
        (pgdata / "postmaster.pid").write_text(
            f"{stranger.pid}\n{pgdata}\n{int(time.time()) - 3600}\n5432\n{pgdata}\n\n  5432001    32768\nready   \n")
        failed = ragsvc(data_dir, "db", "upgrade")
        # before: "connection refused ... Set RAGSVC_DATA_DIR to a folder the current user can write", and
        # pgserver, taking the stranger for the server, killed it on exit ("could not send stop signal")
        one_clear_line(failed, str(pgdata), f"process {stranger.pid} (sleep 60)", "not a PostgreSQL server",
                       f"delete {pgdata / 'postmaster.pid'}")
        assert stranger.poll() is None, "the stranger was killed"
    finally:
        stranger.kill()
        stranger.wait()
    (pgdata / "postmaster.pid").unlink()
    assert ragsvc(data_dir, "db", "upgrade").returncode == 0


LOCK_HOLDER = """
import sys, time, warnings
warnings.simplefilter("ignore")
from pgserver.postgres_server import PostgresServer
with PostgresServer._lock:
    print("locked", flush=True)
    time.sleep(float(sys.argv[1]))
"""


@needs_embedded
def test_a_start_up_lock_held_by_a_hung_process_is_a_clear_error_not_a_hang(data_dir: Path) -> None:
    # A ragsvc stuck while starting its server (stopped in a debugger, Ctrl-Z) holds pgserver's lock.
    # The lock is one for every embedded server of this user: it is held for a few seconds only.
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, "20"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        started = time.monotonic()
        failed = ragsvc(data_dir, "db", "upgrade", wait_s=1, timeout_s=30)  # before: waited forever
        assert time.monotonic() - started < 15
        one_clear_line(failed, str(data_dir / "pg"), f"process {holder.pid}", "start-up lock", f"kill {holder.pid}")
    finally:
        holder.kill()
        holder.wait()
    assert ragsvc(data_dir, "db", "upgrade", wait_s=10).returncode == 0


@needs_embedded
def test_a_server_on_the_data_dir_that_does_not_answer_is_a_clear_error_then_shared(data_dir: Path) -> None:
    import pgserver

    pgdata = data_dir / "pg"
    other = pgserver.get_server(pgdata, cleanup_mode="stop")  # another process's server, as far as ragsvc knows
    try:
        pid = other.get_pid()
        os.kill(pid, signal.SIGSTOP)  # hung
        try:
            started = time.monotonic()
            failed = ragsvc(data_dir, "db", "upgrade", wait_s=2, timeout_s=60)  # before: hung, saying nothing
            assert time.monotonic() - started < 20
            one_clear_line(failed, str(pgdata), f"process {pid}", "does not accept connections", f"kill -INT {pid}")
        finally:
            os.kill(pid, signal.SIGCONT)
        # Once it answers, a second process shares it and leaves it running.
        assert ragsvc(data_dir, "db", "upgrade").returncode == 0
        assert running_pid(data_dir) == pid
    finally:
        other.cleanup()
