"""Error rates of the always-valid A/B test (rag_service/learning/sequential.py), by simulation.

    .venv/bin/python -m benchmarks.experiment_power [--experiments 10000] [--look-every 20] [--max-per-arm 1000]

For each effect (default: 0, the A/A case, then -0.05, -0.03 and +0.05 on the overall score),
simulates that many experiments at once: each arrival goes to the candidate with probability
--share, scores are Beta with mean 0.75 and sd 0.15 in the control arm and 0.75 + effect in the
candidate (--scores bernoulli: 0/1 outcomes, e.g. sent to review), and every experiment is looked at
after every --look-every arrivals and stopped at the first p <= alpha, for at most
--max-per-arm / max(share, 1 - share) arrivals. Reported per effect: the rejection rate (the
false-positive rate when the effect is 0, the power otherwise), the median arrivals at detection,
the share of detections in the right direction, and the wall time. No database, no model.

Ends with one JSON line of every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from dataclasses import asdict
from datetime import UTC, datetime

from rag_service.learning.sequential import SCORES, simulate


def log(message: str) -> None:
    print(message, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiments", type=int, default=10_000)
    parser.add_argument("--max-per-arm", type=int, default=1000, help="expected size of the larger arm at the end")
    parser.add_argument("--look-every", type=int, default=20, help="arrivals between two looks")
    parser.add_argument("--effects", type=float, nargs="+", default=[0.0, -0.05, -0.03, 0.05],
                        help="candidate mean minus control mean (0.75)")
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--tau", type=float, default=0.05, help="sd of the normal mixture over the difference")
    parser.add_argument("--burn-in", type=int, default=20, help="observations per arm before the first look")
    parser.add_argument("--share", type=float, default=0.5, help="probability an arrival goes to the candidate")
    parser.add_argument("--scores", choices=SCORES, default="beta")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    machine = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
               "cpus": os.cpu_count(), "python": platform.python_version()}
    figures: dict = {"benchmark": "experiment_power", "date": datetime.now(UTC).isoformat(timespec="seconds"),
                     "machine": machine, "alpha": args.alpha, "tau": args.tau, "burn_in": args.burn_in,
                     "share": args.share, "scores": args.scores, "seed": args.seed, "runs": []}
    log(f"{figures['date']}  {machine['platform']}  {machine['processor']}, {machine['cpus']} CPUs")
    log(f"alpha {args.alpha}, tau {args.tau}, burn-in {args.burn_in} per arm, share {args.share}, "
        f"{args.scores} scores (control mean 0.75, sd 0.15), a look every {args.look_every} arrivals\n")
    log(f"{'effect':>7} {'experiments':>11} {'max arrivals':>12} {'rejection rate':>18} "
        f"{'median arrivals':>15} {'direction ok':>12} {'wall s':>7}")
    for effect in args.effects:
        start = time.perf_counter()
        result = simulate(args.experiments, args.max_per_arm, args.look_every, effect, alpha=args.alpha,
                          tau=args.tau, burn_in=args.burn_in, share=args.share, seed=args.seed, scores=args.scores)
        wall = time.perf_counter() - start
        rate = f"{result.rejection_rate:.4f} ({'FPR' if effect == 0 else 'power'})"
        median = "-" if result.median_arrivals is None else f"{result.median_arrivals:.0f}"
        direction = "-" if result.direction_correct_rate is None else f"{result.direction_correct_rate:.4f}"
        log(f"{effect:>+7.3f} {result.n_experiments:>11} {result.max_arrivals:>12} {rate:>18} "
            f"{median:>15} {direction:>12} {wall:>7.1f}")
        figures["runs"].append(asdict(result) | {"wall_s": round(wall, 2)})
    log("")
    log(json.dumps(figures))


if __name__ == "__main__":
    main()
