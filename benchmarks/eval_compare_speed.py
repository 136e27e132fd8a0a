"""Wall time of the paired run comparison (evaluation/compare.py) on two synthetic runs.

    .venv/bin/python -m benchmarks.eval_compare_speed [--items 10000] [--metrics 12] [--resamples 10000]
                                                      [--missing 0.0] [--repeat 3] [--seed 0]

Two runs over the same items: each item has a difficulty both runs share, each run adds its own
noise, and run B is 0.01 better on the first metric. ``--missing`` leaves that share of items
unscored (None) in run B, at random per metric, so every metric has its own item set (the case that
would cost one resample per item set if metrics did not share one). The time covers compare()
from the two runs' dicts to the result, not the data generation; the best and every repeat are
printed, with the machine. Ends with one JSON line of every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from datetime import UTC, datetime

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
    print(json.dumps({"benchmark": "eval_compare_speed", "at": datetime.now(UTC).isoformat(timespec="seconds"),
                      "items": args.items, "metrics": args.metrics, "resamples": args.resamples,
                      "missing": args.missing, "seconds": seconds, "best_seconds": min(seconds), "machine": machine}))


if __name__ == "__main__":
    main()
