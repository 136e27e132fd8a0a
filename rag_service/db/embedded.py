"""The embedded PostgreSQL 16 + pgvector default, started from the ``pgserver`` package.

pgserver keeps a list of the processes that hold a handle on a data directory; the server stops
when the last one exits. So a second ``ragsvc`` process on the same data dir (``ragsvc ingest``
while ``ragsvc serve`` runs) attaches to the running server instead of starting another.

As root, pgserver runs PostgreSQL as an unprivileged ``pgserver`` user and opens the parent
folders of the data dir to it (o+rx): keep the data dir out of mode-700 homes.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import psutil
import psycopg
from psycopg.conninfo import make_conninfo
from sqlalchemy import URL

from rag_service.errors import (
    DatabaseUnavailableError,
    DataDirInUseError,
    RagServiceError,
    StorageFullError,
    StorageNotWritableError,
)

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


def start_embedded(data_dir: Path, *, wait_s: float = 60.0) -> EmbeddedServer:
    """Start (or attach to) the embedded server whose data lives in ``data_dir/pg``.

    Idempotent within a process. Creates the application database on first start. Waits at most
    ``wait_s`` for another process (pgserver's start-up lock, a server still starting); a data dir
    held by another process, full or read-only is a one-line error naming it and what to do.
    """
    data_dir = data_dir.expanduser().resolve()
    pgdata = data_dir / "pg"
    if pgdata in _servers:
        return _servers[pgdata]
    started = time.perf_counter()
    log_start: int | None = None  # where this attempt's lines begin in the server's log
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI); its fallback is fine.
            warnings.simplefilter("ignore")
            import pgserver
            from pgserver.postgres_server import PostgresServer

            with _start_lock(PostgresServer._lock, pgdata, wait_s):
                _prune_dead_handles(pgdata)
                running = _running_postmaster(pgdata, wait_s)
            if running is not None:
                # Before pgserver attaches (and registers this process to stop the server on exit).
                _check_answers(pgdata, running, wait_s)
            log_start = _log_size(pgdata)
            # pgserver takes the lock again itself, waiting without a bound: the wait above is the bounded one.
            with _pgserver_errors_unlogged():
                server = pgserver.get_server(pgdata, cleanup_mode="stop")
        info = server.get_postmaster_info()
        embedded = EmbeddedServer(pgdata, Path(info.socket_dir or pgdata), int(info.port or 5432), info.pid or 0, 0.0)
        _ensure_database(embedded.admin_conninfo, DATABASE_NAME, timeout_s=wait_s)
    except RagServiceError:
        raise
    except Exception as exc:  # pgserver raises bare CalledProcessError/AssertionError/OSError
        raise _start_failure(data_dir, pgdata, exc, log_start) from exc
    embedded = replace(embedded, started_in_s=time.perf_counter() - started)
    _servers[pgdata] = embedded
    log.info("embedded PostgreSQL ready in %.2fs (pid %s, data %s)", embedded.started_in_s, embedded.pid, pgdata)
    return embedded


@contextlib.contextmanager
def _pgserver_errors_unlogged() -> Iterator[None]:
    """pgserver logs a failed start as ERROR records holding the command's output and the whole
    server log; the error raised from here says why in one line and names the log file instead."""
    logger = logging.getLogger("pgserver")
    level = logger.level
    if not logger.isEnabledFor(logging.DEBUG):
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


@contextlib.contextmanager
def _start_lock(lock: Any, pgdata: Path, wait_s: float) -> Iterator[None]:
    """pgserver's start-up lock (one per user, for every data dir: held while a server is
    initialised, started or stopped), waited for at most ``wait_s``: pgserver itself waits
    forever behind a process that hangs while holding it."""
    if not lock.acquire(timeout=wait_s):
        path = Path(os.fsdecode(lock.path))
        holder = _lock_holder(path)
        who = f"process {holder[0]} ({holder[1]})" if holder else "another process"
        what = f"stop it (kill {holder[0]})" if holder else "stop the other ragsvc processes"
        raise DataDirInUseError(
            f"cannot start the embedded PostgreSQL in {pgdata}: {who} has held pgserver's start-up lock "
            f"{path} for over {wait_s:.0f} s (it is starting or stopping an embedded PostgreSQL, or hangs "
            f"doing so). Wait for it to finish, or if it hangs {what}, then retry."
        )
    try:
        yield
    finally:
        lock.release()


def _lock_holder(path: Path) -> tuple[int, str] | None:
    """The pid and command line of the process holding a POSIX lock on ``path`` (Linux's
    /proc/locks), if it can be found."""
    try:
        st = path.stat()
        ident = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
        for line in Path("/proc/locks").read_text().splitlines():
            fields = line.split()
            # "1: POSIX  ADVISORY  WRITE 1234 00:2f:5678 0 EOF"; waiters' lines have "->" after the number.
            if len(fields) >= 6 and fields[1] != "->" and fields[5] == ident and int(fields[4]) != os.getpid():
                pid = int(fields[4])
                return pid, _describe(psutil.Process(pid))
    except (OSError, ValueError, psutil.Error):
        pass
    return None


def _describe(process: psutil.Process) -> str:
    try:
        return " ".join(" ".join(process.cmdline()).split())[:160] or process.name()  # one line
    except psutil.Error:
        return "unknown command"


def _running_postmaster(pgdata: Path, wait_s: float) -> int | None:
    """The pid of the PostgreSQL already running on ``pgdata`` (None: none runs), once it is
    ready. A postmaster.pid that names a live process which is not that server (a pid reused
    after a crash) is refused: pgserver would take that process for the server, and kill it on exit."""
    deadline = time.monotonic() + wait_s
    while True:
        lines = _pidfile_lines(pgdata)
        if not lines:
            return None
        try:
            process = psutil.Process(int(lines[0]))
        except (ValueError, psutil.NoSuchProcess):
            if len(lines) < 8:
                # Half-written by a server that died (pgserver cannot read it; PostgreSQL would replace it).
                with contextlib.suppress(FileNotFoundError):
                    (pgdata / "postmaster.pid").unlink()
            return None
        if not _is_postmaster_of(process, pgdata):
            raise DataDirInUseError(
                f"cannot start the embedded PostgreSQL in {pgdata}: its postmaster.pid names process "
                f"{process.pid} ({_describe(process)}), which is not a PostgreSQL server of this data dir: the file "
                "was left by a server that did not stop cleanly, and its pid now belongs to another process. "
                f"Make sure no PostgreSQL uses {pgdata}, delete {pgdata / 'postmaster.pid'}, then retry."
            )
        status = lines[7].strip() if len(lines) >= 8 else "starting"
        if status in ("ready", "standby"):
            return process.pid
        if time.monotonic() > deadline:
            raise DataDirInUseError(
                f"cannot start the embedded PostgreSQL in {pgdata}: the PostgreSQL already running there (process "
                f"{process.pid}) has been '{status}' for over {wait_s:.0f} s. Wait for it, or stop it "
                f"(kill -INT {process.pid}), then retry."
            )
        time.sleep(0.2)


def _check_answers(pgdata: Path, pid: int, wait_s: float) -> None:
    """The server already running on ``pgdata`` accepts a connection within ``wait_s``, or the
    data dir is held by a server nobody can use (stopped, hung, another user's)."""
    lines = _pidfile_lines(pgdata)
    socket_dir = lines[4].strip() if len(lines) > 4 and lines[4].strip() else "localhost"
    port = lines[3].strip() if len(lines) > 3 and lines[3].strip() else "5432"
    conninfo = make_conninfo(host=socket_dir, port=port, user="postgres", dbname="postgres",
                             connect_timeout=max(2, round(wait_s)))
    try:
        psycopg.connect(conninfo).close()
    except psycopg.OperationalError as exc:
        raise DataDirInUseError(
            f"cannot use the embedded PostgreSQL in {pgdata}: the server already running there (process {pid}, "
            f"started by another ragsvc or by hand) does not accept connections: {_first_line(exc)}. If it hangs, "
            f"stop it (kill -INT {pid}, or kill -9 {pid} if that does not help), then retry."
        ) from exc


def _pidfile_lines(pgdata: Path) -> list[str]:
    try:
        return (pgdata / "postmaster.pid").read_text().splitlines()
    except (FileNotFoundError, NotADirectoryError):
        return []


def _is_postmaster_of(process: psutil.Process, pgdata: Path) -> bool:
    """Whether ``process`` is a PostgreSQL server on ``pgdata`` (it runs in its data directory).
    When that cannot be seen (another user's process), assume it is: never mistake a server for
    a stranger."""
    try:
        if process.name() not in ("postgres", "postmaster"):
            return False
        return Path(process.cwd()).resolve() == pgdata.resolve()
    except psutil.AccessDenied:
        return True
    except psutil.NoSuchProcess:
        return False


def _start_failure(data_dir: Path, pgdata: Path, exc: Exception, log_start: int | None) -> RagServiceError:
    """What went wrong starting the server, as the user can act on it: a full or read-only data
    dir is named as such; the server's log (what this attempt wrote to it) says why it stopped."""
    reason = (_log_reason(pgdata, log_start) if log_start is not None else None) or _first_line(exc) \
        or type(exc).__name__
    where = next((p for p in (pgdata, data_dir, *data_dir.parents) if p.exists()), data_dir)
    try:
        free = shutil.disk_usage(where).free
        read_only = bool(os.statvfs(where).f_flag & os.ST_RDONLY)
    except OSError:
        free, read_only = None, False
    errno_ = exc.errno if isinstance(exc, OSError) else None
    if errno_ == errno.ENOSPC or "No space left on device" in reason or (free is not None and free < 16 << 20):
        left = f"{free / (1 << 20):.1f} MB left" if free is not None else "no space left"
        return StorageFullError(
            f"cannot start the embedded PostgreSQL in {pgdata}: the disk that holds the data dir is full ({left}; "
            f"{reason}). Free disk space there, or set RAGSVC_DATA_DIR to a folder on another disk, then retry."
        )
    if read_only or errno_ == errno.EROFS or "Read-only file system" in reason:
        return StorageNotWritableError(
            f"cannot start the embedded PostgreSQL in {pgdata}: the data dir is on a read-only file system "
            f"({reason}). Remount it read-write, or set RAGSVC_DATA_DIR to a writable folder, then retry."
        )
    log_file = pgdata / "log"
    hint = f" See the server log at {log_file}." if log_file.exists() else ""
    return DatabaseUnavailableError(
        f"could not start the embedded PostgreSQL in {pgdata}: {reason}.{hint} "
        "Set RAGSVC_DATA_DIR to a folder the current user can write (not under a mode-700 home "
        "when running as root), or set RAGSVC_DATABASE_URL to use an external PostgreSQL."
    )


def _log_size(pgdata: Path) -> int:
    try:
        return (pgdata / "log").stat().st_size
    except OSError:
        return 0


def _log_reason(pgdata: Path, since: int) -> str | None:
    """The last FATAL or PANIC line the server logged after byte ``since`` (why it did not start)."""
    try:
        with (pgdata / "log").open("rb") as log_file:
            log_file.seek(since)
            lines = log_file.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    reasons = [line.split(":  ", 1)[-1].strip() for line in lines if "FATAL:" in line or "PANIC:" in line]
    return reasons[-1] if reasons else None


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else ""


def _ensure_database(admin_conninfo: str, name: str, *, timeout_s: float = 60.0) -> None:
    from psycopg import sql

    # A bound on connecting: a server that hangs (stopped, swapping) must not hang us.
    with psycopg.connect(admin_conninfo, autocommit=True, connect_timeout=max(2, int(timeout_s))) as conn:
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
