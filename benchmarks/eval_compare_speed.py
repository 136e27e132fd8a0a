"""Wall time of the paired run comparison (evaluation/compare.py) on two synthetic runs.

    .venv/bin/python -m benchmarks.eval_compare_speed [--items 10000] [--metrics 12] [--resamples 10000]
                                                      [--missing 0.0] [--repeat 3] [--seed 0]

Two runs over the same items: each item has a difficulty both runs share, each run adds its own
noise, and run B is 0.01 better on the first metric. ``--missing`` leaves that share of items
unscored (None) in run B, at random per metric, so every metric has its own item set (the case that
would cost one resample per item set if metrics did not share one). The time covers compare()
from the two runs' dicts to the result, not the data generation; the best and every repeat are
printed, with the machine.

``--stored DIR`` also measures what ``ragsvc eval compare`` does: the two runs are written to the
database in DIR (or ``RAGSVC_DATABASE_URL``) as real eval results, each with a full retrieval list
(``--retrieved``, 100 by default, as a retrieval run stores), and ``evaluation.comparisons.compare_runs``
is timed from the run names to the result: loading both runs' results from PostgreSQL included. Then
the CLI command itself is timed in a fresh process (its start-up included). Ends with one JSON line
of every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from evaluation.compare import compare


def synthetic_runs(items: int, metrics: int, missing: float, seed: int) -> tuple[dict, dict]:
    rng = np.random.default_rng(seed)
    ids = [f"q{i:06d}" for i in range(items)]
    run_a: dict[str, dict[str, float | None]] = {}
    run_b: dict[str, dict[str, float | None]] = {}
    for k in range(metrics):
        difficulty = 0.6 + 0.15 * rng.standard_normal(items)
        a = difficulty + 0.1 * rng.standard_normal(items)
        b = difficulty + 0.1 * rng.standard_normal(items) + (0.01 if k == 0 else 0.0)
        unscored = rng.random(items) < missing
        run_a[f"metric_{k}"] = dict(zip(ids, a.tolist(), strict=True))
        run_b[f"metric_{k}"] = {i: None if gone else v for i, v, gone in zip(ids, b.tolist(), unscored, strict=True)}
    return run_a, run_b


async def stored_compare(data_dir: Path, run_a: dict, run_b: dict, retrieved: int, repeat: int) -> dict:
    """Both runs stored as eval results, then compare_runs timed from their names (loading included)."""
    from benchmarks.datasets import open_runtime
    from evaluation.comparisons import compare_runs
    from rag_service.domain import DatasetRef, EvalItemResult, EvalRunRequest, RetrievedRef

    runtime = open_runtime(data_dir)
    try:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
        names = (f"compare-speed-a-{stamp}", f"compare-speed-b-{stamp}")
        items = sorted(next(iter(run_a.values())))
        dataset = DatasetRef(kind="qa", name="synthetic", version=f"synthetic-{stamp}", source="synthetic",
                             items=len(items))
        started = time.perf_counter()
        for name, run in zip(names, (run_a, run_b), strict=True):
            record = await runtime.eval_runs.create(
                name=name, dataset=dataset, request=EvalRunRequest(dataset="qa:synthetic", name=name),
                collection="synthetic", config={}, config_hash="synthetic", code_version=None,
                items_total=len(items))
            for position, item in enumerate(items):
                await runtime.eval_runs.record(record.id, position, EvalItemResult(
                    item_id=item, repetition=0, question=f"question {item}",
                    retrieved=[RetrievedRef(rank=r, id=f"doc-{(position * 7 + r) % 50_000}", score=1.0 / r)
                               for r in range(1, retrieved + 1)],
                    metrics={metric: values[item] for metric, values in run.items()}))
            await runtime.eval_runs.finish(record.id, summary={})
        setup = time.perf_counter() - started
        seconds = []
        for _ in range(repeat):
            found = await compare_runs(runtime.eval_runs, names[0], names[1])
            seconds.append(found.seconds)
    finally:
        await runtime.close()
    return {"runs": list(names), "retrieved_per_item": retrieved, "write_seconds": round(setup, 1),
            "compare_runs_seconds": [round(s, 3) for s in seconds], "compare_runs_best": round(min(seconds), 3)}


def cli_compare_seconds(data_dir: Path, names: list[str]) -> float:
    env = {**os.environ, "RAGSVC_DATA_DIR": str(data_dir)}
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "rag_service.cli", "eval", "compare", *names, "--json"], env=env,
                   check=True, stdout=subprocess.DEVNULL)
    return round(time.perf_counter() - started, 2)


def cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            return next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), None)
    except OSError:  # not Linux
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--metrics", type=int, default=12)
    parser.add_argument("--resamples", type=int, default=10_000)
    parser.add_argument("--missing", type=float, default=0.0, help="share of items unscored in run B, per metric")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stored", type=Path, metavar="DATA_DIR",
                        help="also store both runs in this data dir's database and time compare_runs and the CLI")
    parser.add_argument("--retrieved", type=int, default=100, help="retrieved documents stored per item (--stored)")
    args = parser.parse_args()

    machine = {"platform": platform.platform(), "processor": cpu_model() or platform.processor() or platform.machine(),
               "cpus": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__}
    print(f"machine: {machine}", flush=True)
    run_a, run_b = synthetic_runs(args.items, args.metrics, args.missing, args.seed)
    seconds = []
    for _ in range(args.repeat):
        started = time.perf_counter()
        result = compare(run_a, run_b, resamples=args.resamples, seed=args.seed)
        seconds.append(time.perf_counter() - started)
    first = result.metric("metric_0")
    print(f"compare: {args.items:,} items x {args.metrics} metrics x {args.resamples:,} resamples, "
          f"{args.missing:.0%} unscored in B: best {min(seconds):.2f} s, every run {[round(s, 2) for s in seconds]}")
    print(f"metric_0 (planted +0.01): {first.difference:+.4f}, 95% CI {first.ci_low:+.4f} to {first.ci_high:+.4f}, "
          f"Holm p {first.p_holm:.2g}, n {first.n}")
    stored = None
    if args.stored:
        stored = asyncio.run(stored_compare(args.stored, run_a, run_b, args.retrieved, args.repeat))
        stored["cli_seconds"] = cli_compare_seconds(args.stored, stored["runs"])
        print(f"stored: wrote 2 x {args.items:,} results with {args.retrieved} retrieved each in "
              f"{stored['write_seconds']} s; compare_runs (load + compare) best {stored['compare_runs_best']} s, "
              f"every run {stored['compare_runs_seconds']}; `ragsvc eval compare` in a new process "
              f"{stored['cli_seconds']} s")
    print(json.dumps({"benchmark": "eval_compare_speed", "at": datetime.now(UTC).isoformat(timespec="seconds"),
                      "items": args.items, "metrics": args.metrics, "resamples": args.resamples,
                      "missing": args.missing, "seconds": seconds, "best_seconds": min(seconds), "stored": stored,
                      "machine": machine}))


if __name__ == "__main__":
    main()
