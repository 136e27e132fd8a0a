"""The experiments' test when assignment is sticky per API key or conversation, by simulation.

    .venv/bin/python -m benchmarks.experiment_clusters [--experiments 500] [--answers 1000] [--alpha 0.0167]

Each experiment has K units (API keys or conversations; --units, default 20 40 200), each unit all
in one arm (half the units each) and with its own level: unit effects ~ N(0, --unit-sd 0.05) on top
of Beta-like answer noise (sd 0.15) around 0.75, plus the candidate's effect. The service's test
(``clustered_test``: cluster-robust variance, looks every 10 answers, with the report's minimum of
15 units and 20 answers per arm) is compared with the plain ``sequential_test``, which treats
answers as independent. Reported: the rejection rate (false-positive rate when the effect is 0,
power otherwise). alpha defaults to 0.05/3, the level each deciding metric gets in the service. No database, no model.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import time

import numpy as np

from rag_service.learning.report import BURN_IN, MIN_UNITS
from rag_service.learning.sequential import clustered_test, sequential_test


def simulate(units: int, answers: int, effect: float, unit_sd: float, alpha: float, experiments: int,
             rng: np.random.Generator) -> tuple[float, float]:
    clustered = plain = 0
    for _ in range(experiments):
        unit_level = rng.normal(0.0, unit_sd, units)
        unit_arm = rng.permutation(np.arange(units) % 2 == 1)  # half the units in each arm
        unit = rng.integers(0, units, answers)
        arm = unit_arm[unit]
        x = np.clip(0.75 + unit_level[unit] + effect * arm + rng.normal(0.0, 0.15, answers), 0.0, 1.0)
        clustered += clustered_test(x, arm, unit, alpha=alpha, burn_in=BURN_IN, min_units=MIN_UNITS).significant
        plain += sequential_test(x, arm, alpha=alpha).significant
    return clustered / experiments, plain / experiments


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiments", type=int, default=500)
    parser.add_argument("--answers", type=int, default=1000, help="answers per experiment")
    parser.add_argument("--units", type=int, nargs="+", default=[20, 40, 200])
    parser.add_argument("--effects", type=float, nargs="+", default=[0.0, -0.05])
    parser.add_argument("--unit-sd", type=float, default=0.05)
    parser.add_argument("--alpha", type=float, default=0.05 / 3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    print(f"{dt.datetime.now(dt.UTC).isoformat(timespec='seconds')}  {platform.platform()}  {os.cpu_count()} CPUs")
    print(f"{args.experiments} experiments of {args.answers} answers, unit sd {args.unit_sd}, alpha {args.alpha:.4f}")
    print(f"{'units':>6} {'effect':>7} {'clustered test':>15} {'plain test':>11} {'wall s':>7}")
    runs = []
    for units in args.units:
        for effect in args.effects:
            started = time.perf_counter()
            clustered, plain = simulate(units, args.answers, effect, args.unit_sd, args.alpha, args.experiments, rng)
            wall = time.perf_counter() - started
            runs.append({"units": units, "effect": effect, "clustered": clustered, "plain": plain,
                         "wall_s": round(wall, 1)})
            print(f"{units:>6} {effect:>+7.3f} {clustered:>15.4f} {plain:>11.4f} {wall:>7.1f}")
    print(json.dumps({"benchmark": "experiment_clusters", "alpha": args.alpha, "answers": args.answers,
                      "experiments": args.experiments, "unit_sd": args.unit_sd, "runs": runs}))


if __name__ == "__main__":
    main()
