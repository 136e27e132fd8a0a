"""Faults of the embedded database's data dir at start-up (the volume helpers: test_faults_storage.py).

- The data dir itself full or read-only when the embedded PostgreSQL has to start there.
- The data dir locked by another process: a postmaster.pid naming a live process that is not
  PostgreSQL, pgserver's start-up lock held by a stuck process, a server there that does not answer.
  A clear one-line error naming the data dir, the other process and what to do, instead of a
  traceback, a hang, or a stranger's process killed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rag_service.db.embedded import running_pid
from tests.conftest import EXTERNAL_DATABASE_URL, scratch_dir
from tests.test_faults_storage import (
    fill,
    mount_tmpfs,
    needs_embedded,
    one_clear_line,
    ragsvc,
    remount,
    unmount,
)


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
