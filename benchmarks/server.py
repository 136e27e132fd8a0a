"""`ragsvc serve` as a subprocess for benchmarks that measure over HTTP."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

RAGSVC = str(Path(sys.executable).parent / "ragsvc")


class ServerFailed(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serve(data_dir: Path, ready_timeout_s: float = 300, **env_overrides: str) -> Iterator[str]:
    """Start ``ragsvc serve`` on ``data_dir`` (it attaches to a running embedded PostgreSQL), wait
    for /readyz, yield the base URL; stop with SIGTERM. Raises ServerFailed with the log's tail."""
    port = free_port()
    env = dict(os.environ, RAGSVC_DATA_DIR=str(data_dir), **env_overrides)
    with tempfile.TemporaryFile(mode="w+") as server_log:
        proc = subprocess.Popen([RAGSVC, "serve", "--port", str(port)], env=env, stdout=subprocess.DEVNULL,
                                stderr=server_log)

        def failure(what: str) -> ServerFailed:
            server_log.seek(0)
            return ServerFailed(f"{what}; server log: {server_log.read()[-500:].strip()}")

        base = f"http://127.0.0.1:{port}"
        try:
            started = time.perf_counter()
            while True:
                if proc.poll() is not None:
                    raise failure(f"ragsvc serve exited with {proc.returncode}")
                if time.perf_counter() - started > ready_timeout_s:
                    raise failure(f"/readyz did not answer 200 within {ready_timeout_s:.0f} s")
                try:
                    if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.2)
            yield base
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
