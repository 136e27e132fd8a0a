"""``ragsvc eval`` as a user runs it, in subprocesses against the real PostgreSQL: a run killed with
SIGKILL mid-way resumes without redoing the items it stored; compare and report work on the stored
runs; bad input is one line naming what to fix."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg

from tests.conftest import NO_WALL_CLOCK_LIMITS, SHARED_DATA, scratch_dir, settings_env

RAGSVC = str(Path(sys.executable).parent / "ragsvc")
XQUAD = SHARED_DATA / "xquad_en" / "xquad_en_flat.jsonl"


def _env(url: str, data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAGSVC_")}
    env.update(RAGSVC_DATABASE_URL=url, RAGSVC_DATA_DIR=str(data_dir))
    return env


def _data_dir(model_cache: Path) -> Path:
    """A data dir whose model folder is the session's: the ONNX export is not made again."""
    root = scratch_dir("ragsvc-eval-cli-")
    (root / "models").symlink_to(model_cache, target_is_directory=True)
    return root


def _libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def _stored(url: str) -> dict[tuple[str, int], object]:
    with psycopg.connect(_libpq(url)) as conn:
        rows = conn.execute("SELECT item_id, repetition, finished_at FROM eval_results").fetchall()
    return {(item, rep): at for item, rep, at in rows}


def test_a_killed_run_resumes_without_redoing_stored_items_then_compares_and_reports(
        databases, model_cache: Path, tmp_path: Path) -> None:  # noqa: ANN001
    url = databases.create()
    # With the fresh run's concurrency on a busy machine, the pipeline's wall-clock limits could make
    # the two runs' retrieval differ: lifted, the comparison stays about resuming.
    env = _env(url, _data_dir(model_cache)) | settings_env(NO_WALL_CLOCK_LIMITS)
    dataset = tmp_path / "xquad_120.jsonl"
    dataset.write_text("".join(XQUAD.read_text().splitlines(keepends=True)[:120]))
    spec = f"qa:{dataset}"

    # One item at a time, so the kill lands mid-run.
    proc = subprocess.Popen([RAGSVC, "eval", "run", "--dataset", spec, "--concurrency", "1", "--name", "killed",
                             "--json"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while len(_stored(url)) < 10:
            assert proc.poll() is None, f"the run ended before it could be killed: {proc.stderr.read()[-2000:]}"
            assert time.monotonic() < deadline, "no results stored in 5 minutes"
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    before = _stored(url)
    assert 10 <= len(before) < 120

    # It reported progress moments ago: resume refuses unless told the process is gone.
    refused = subprocess.run([RAGSVC, "eval", "resume", "killed"], env=env, capture_output=True, text=True,
                             timeout=300)
    assert refused.returncode != 0 and "running elsewhere" in refused.stderr

    resumed = subprocess.run([RAGSVC, "eval", "resume", "killed", "--force", "--json"], env=env, capture_output=True,
                             text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    run = json.loads(resumed.stdout)
    assert (run["status"], run["items_done"], run["items_total"], run["items_failed"]) == ("finished", 120, 120, 0)
    after = _stored(url)
    assert len(after) == 120
    assert all(after[key] == at for key, at in before.items())  # stored before the kill: not run again

    again = subprocess.run([RAGSVC, "eval", "run", "--dataset", spec, "--name", "fresh", "--json"], env=env,
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    fresh = json.loads(again.stdout)
    assert fresh["summary"]["metrics"]["ndcg@10"] == run["summary"]["metrics"]["ndcg@10"]  # deterministic

    compared = subprocess.run([RAGSVC, "eval", "compare", "killed", "fresh", "--json"], env=env, capture_output=True,
                              text=True, timeout=300)
    assert compared.returncode == 0, compared.stderr[-2000:]
    comparison = json.loads(compared.stdout)
    ndcg = next(m for m in comparison["metrics"] if m["metric"] == "ndcg@10")
    assert ndcg["n"] == 120 and ndcg["difference"] == 0 and not ndcg["significant"]

    report = tmp_path / "report.html"
    written = subprocess.run([RAGSVC, "eval", "report", "fresh", "--against", "killed", "--format", "html",
                              "--output", str(report), "--json"], env=env, capture_output=True, text=True, timeout=300)
    assert written.returncode == 0, written.stderr[-2000:]
    page = report.read_text()
    assert page.count("data:image/png;base64,") >= 3 and "ndcg@10" in page

    bad = subprocess.run([RAGSVC, "eval", "run", "--dataset", "csv:nope"], env=env, capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and "--dataset" in bad.stderr and "beir:DIR" in bad.stderr
