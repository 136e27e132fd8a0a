"""Time from `ragsvc serve` to /readyz answering 200, on the embedded defaults.

    .venv/bin/python -m benchmarks.cold_start [--runs 3]

"cold": a new data dir (initdb, migrations, model load). "warm": the same data dir again
(server start and model load only). Ends with one JSON line of the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

RAGSVC = str(Path(sys.executable).parent / "ragsvc")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def time_to_ready(data_dir: Path) -> float:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAGSVC_")}
    env["RAGSVC_DATA_DIR"] = str(data_dir)
    start = time.perf_counter()
    proc = subprocess.Popen([RAGSVC, "serve", "--port", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"ragsvc serve exited with {proc.returncode}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                    return time.perf_counter() - start
            except httpx.TransportError:
                pass
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    cold, warm = [], []
    for run in range(args.runs):
        root = Path(tempfile.mkdtemp(prefix="ragsvc-bench-", dir="/tmp"))
        root.chmod(0o755)
        try:
            cold.append(time_to_ready(root / "data"))
            warm.append(time_to_ready(root / "data"))
        finally:
            shutil.rmtree(root, ignore_errors=True)
        print(f"run {run + 1}: cold {cold[-1]:.2f} s, warm {warm[-1]:.2f} s")
    print(json.dumps({
        "benchmark": "cold_start", "runs": args.runs,
        "cold_ready_s_median": round(statistics.median(cold), 2), "cold_ready_s_max": round(max(cold), 2),
        "warm_ready_s_median": round(statistics.median(warm), 2), "warm_ready_s_max": round(max(warm), 2),
    }))


if __name__ == "__main__":
    main()
