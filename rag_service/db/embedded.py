"""The embedded PostgreSQL 16 + pgvector default, started from the ``pgserver`` package.

pgserver keeps a list of the processes that hold a handle on a data directory; the server stops
when the last one exits. So a second ``ragsvc`` process on the same data dir (``ragsvc ingest``
while ``ragsvc serve`` runs) attaches to the running server instead of starting another.

As root, pgserver runs PostgreSQL as an unprivileged ``pgserver`` user and opens the parent
folders of the data dir to it (o+rx): keep the data dir out of mode-700 homes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

import psutil
from psycopg.conninfo import make_conninfo
from sqlalchemy import URL

from rag_service.errors import DatabaseUnavailableError

log = logging.getLogger(__name__)

DATABASE_NAME = "ragsvc"


@dataclass(frozen=True)
class EmbeddedServer:
    pgdata: Path
    socket_dir: Path
    port: int
    pid: int
    started_in_s: float

    @property
    def admin_conninfo(self) -> str:
        """libpq conninfo of the maintenance database ("postgres")."""
        return make_conninfo(host=str(self.socket_dir), port=self.port, user="postgres", dbname="postgres")

    def url_for(self, database: str) -> str:
        """SQLAlchemy URL (psycopg 3 driver) for a database on this server, escaped properly
        whatever characters the data dir path holds."""
        url = URL.create("postgresql+psycopg", username="postgres", database=database,
                         query={"host": str(self.socket_dir), "port": str(self.port)})
        return url.render_as_string(hide_password=False)


_servers: dict[Path, EmbeddedServer] = {}


def _prune_dead_handles(pgdata: Path) -> None:
    """Drop pids of processes that died without cleaning up (SIGKILL), so the last live
    process still stops the server on exit. pgserver itself never prunes this list."""
    handles = pgdata / ".handle_pids.json"
    try:
        pids = json.loads(handles.read_text())
    except (FileNotFoundError, ValueError):
        return
    alive = [pid for pid in pids if psutil.pid_exists(pid)]
    if alive != pids:
        handles.write_text(json.dumps(alive))


def start_embedded(data_dir: Path) -> EmbeddedServer:
    """Start (or attach to) the embedded server whose data lives in ``data_dir/pg``.

    Idempotent within a process. Creates the application database on first start.
    """
    data_dir = data_dir.expanduser().resolve()
    pgdata = data_dir / "pg"
    if pgdata in _servers:
        return _servers[pgdata]
    started = time.perf_counter()
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI); its fallback is fine.
            warnings.simplefilter("ignore")
            import pgserver
            from pgserver.postgres_server import PostgresServer

            with PostgresServer._lock:
                _prune_dead_handles(pgdata)
            server = pgserver.get_server(pgdata, cleanup_mode="stop")
        info = server.get_postmaster_info()
        embedded = EmbeddedServer(pgdata, Path(info.socket_dir or pgdata), int(info.port or 5432), info.pid or 0, 0.0)
        _ensure_database(embedded.admin_conninfo, DATABASE_NAME)
    except Exception as exc:  # pgserver raises bare CalledProcessError/AssertionError/OSError
        log_file = pgdata / "log"
        hint = f" See the server log at {log_file}." if log_file.exists() else ""
        raise DatabaseUnavailableError(
            f"could not start the embedded PostgreSQL in {pgdata}: {exc}.{hint} "
            "Set RAGSVC_DATA_DIR to a folder the current user can write (not under a mode-700 home "
            "when running as root), or set RAGSVC_DATABASE_URL to use an external PostgreSQL."
        ) from exc
    embedded = replace(embedded, started_in_s=time.perf_counter() - started)
    _servers[pgdata] = embedded
    log.info("embedded PostgreSQL ready in %.2fs (pid %s, data %s)", embedded.started_in_s, embedded.pid, pgdata)
    return embedded


def _ensure_database(admin_conninfo: str, name: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(admin_conninfo, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if not exists:
            # Another process may create it between our check and our CREATE.
            with contextlib.suppress(psycopg.errors.DuplicateDatabase):
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def running_pid(data_dir: Path) -> int | None:
    """The pid of the embedded server for ``data_dir`` if one is running, without starting one."""
    pidfile = data_dir.expanduser().resolve() / "pg" / "postmaster.pid"
    try:
        pid = int(pidfile.read_text().splitlines()[0])
    except (FileNotFoundError, ValueError, IndexError, PermissionError):
        return None
    return pid if psutil.pid_exists(pid) and os.path.exists(pidfile) else None
