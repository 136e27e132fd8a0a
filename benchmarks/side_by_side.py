"""No-LLM `/v1/query` latency of several codes or settings, side by side in one run.

    .venv/bin/python -m benchmarks.side_by_side --server before@020630c --server default \\
        --server entities,RAGSVC_ANSWER_SHORT_ANSWER_PARSE=entities [--questions 400] [--rounds 2]

Separate benchmark runs minutes apart differ by more than a few milliseconds on these VMs (their
speed drifts by up to 2.5x), which is the size of the budgets issues set ("p95 rises by no more
than 10 ms"). Here every server runs at once: ``ragsvc serve`` for each ``--server``, and each
XQuAD question is POSTed to each server in turn, one request at a time, in an order drawn afresh
for each question, so drift falls on them all alike and no server always follows the same one.
``--rounds`` passes (default 2); the last one is timed.

A server is ``NAME[@REV][,KEY=VALUE...]``: ``@REV`` runs that commit (a git worktree under
.bench-data/worktrees/COMMIT, imported through PYTHONPATH with this virtualenv), the pairs are its
environment (RAGSVC_* settings; a value cannot hold a comma). Each code gets a fresh data dir holding only the 240 XQuAD
paragraphs, ingested by that code with ``ragsvc ingest`` (.bench-data/side-by-side/COMMIT or ``head``),
so the codes compare on equal data; servers of the same code share it.

Prints, per server, the round trip's p50 / p95 / mean (and for each server after the first, its p95
minus the first's with a 95% paired bootstrap interval over the questions), the server's own per-step p50 / p95
(``timings_ms``), the time each request spent outside the pipeline's total, and the share of
questions given a short answer; the machine's calibration before and after
(benchmarks.calibration); and one JSON line of every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import httpx
import numpy as np
from scipy.stats import bootstrap

from benchmarks.calibration import window_calibration
from benchmarks.datasets import BENCH_DATA, xquad, xquad_rows
from benchmarks.ir import latency
from benchmarks.server import RAGSVC, serve
from rag_service.config import Settings

ROOT = Path(__file__).resolve().parents[1]
WORKTREES = BENCH_DATA / "worktrees"
DATA_DIRS = BENCH_DATA / "side-by-side"


@dataclass(frozen=True)
class Server:
    name: str
    ref: str | None = None  # a commit to run instead of this code
    env: dict[str, str] = field(default_factory=dict)


def parse_server(spec: str) -> Server:
    """``NAME[@REV][,KEY=VALUE...]`` as a Server; ValueError saying what is wrong."""
    head, *pairs = [part.strip() for part in spec.split(",")]
    name, _, ref = head.partition("@")
    if not name:
        raise ValueError(f"{spec!r}: a server needs a name before '@' or ','")
    if "@" in head and not ref:
        raise ValueError(f"{spec!r}: '@' must be followed by a commit")
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key:
            raise ValueError(f"{spec!r}: {pair!r} is not KEY=VALUE")
        if not key.startswith("RAGSVC_") or key == "RAGSVC_DATA_DIR":
            raise ValueError(f"{spec!r}: {key} is not a setting a server may take (RAGSVC_*, not the data dir)")
        # A misspelt setting would be ignored, and the server would run the defaults under its name;
        # another commit may have settings this code does not know, so only this code's are checked.
        if not ref and key.removeprefix("RAGSVC_").lower() not in Settings.model_fields:
            raise ValueError(f"{spec!r}: {key} is no setting of this code")
        env[key] = value
    return Server(name=name, ref=ref or None, env=env)


def order(items: list, i: int, seed: int = 0) -> list:
    """``items`` in the order question ``i`` is asked of them: a permutation drawn afresh for each
    question (seeded), so each server goes first, and follows each other one, about equally often;
    whatever one request leaves behind (writes, collections, caches) falls on any of the others."""
    return random.Random(seed * 1_000_003 + i).sample(items, len(items))


def p95_gap(before: list[float], after: list[float], resamples: int = 4000, seed: int = 0) -> dict[str, float]:
    """``after``'s p95 minus ``before``'s (ms; one request each per question, in the same order) with a
    95% interval: a paired bootstrap over the questions (scipy.stats.bootstrap, ``paired=True``,
    percentile method), since both servers answered each question within the same moment of the
    VM's drift. The interval is this run's sampling over questions, not the spread between runs
    (the VM's speed moves from one hour to the next): a budget ("rises by no more than 10 ms") is
    held in this run where the interval's upper end is within it."""
    if len(before) != len(after) or len(before) < 20:
        raise ValueError("p95_gap needs the same questions for both servers, at least 20")

    def gap(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.percentile(b, 95, axis=axis) - np.percentile(a, 95, axis=axis)

    a, b = np.asarray(before, dtype=np.float64), np.asarray(after, dtype=np.float64)
    interval = bootstrap((a, b), gap, paired=True, vectorized=True, n_resamples=resamples, confidence_level=0.95,
                         method="percentile", random_state=np.random.default_rng(seed)).confidence_interval
    return {"gap_ms": round(float(gap(a, b)), 2), "low_ms": round(float(interval.low), 2),
            "high_ms": round(float(interval.high), 2)}


def _run(args: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(args, env=env, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({done.returncode}): {done.stderr[-800:]}")
    return done.stdout.strip()


def commit_of(ref: str) -> str:
    """The commit ``ref`` names now ("HEAD~3" moves; its hash does not); SystemExit if none."""
    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{ref!r} names no commit of {ROOT}")
    return done.stdout.strip()


def prepare(server: Server, corpus: Path) -> tuple[Path, dict[str, str]]:
    """The server's data dir (made and ingested if need be) and its environment. Worktrees and
    data dirs are named by commit hash, so a moving name never reuses another commit's; this
    code's data dir by its HEAD, with "-dirty" when it has uncommitted changes."""
    env = dict(server.env)
    if server.ref is not None:
        commit = commit_of(server.ref)
        tree = WORKTREES / commit
        if not tree.exists():
            _run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), commit], dict(os.environ))
        if (_run(["git", "-C", str(tree), "rev-parse", "HEAD"], dict(os.environ)) != commit
                or _run(["git", "-C", str(tree), "status", "--porcelain"], dict(os.environ))):
            raise SystemExit(f"{tree} is not a clean checkout of {commit}: remove it (git worktree remove --force)")
        name = commit
    else:
        tree = ROOT
        dirty = bool(_run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"], dict(os.environ)))
        name = commit_of("HEAD") + ("-dirty" if dirty else "")
    # The code imported is the tree's, whatever the caller's PYTHONPATH says.
    env["PYTHONPATH"] = str(tree)
    data_dir = DATA_DIRS / name
    data_dir.mkdir(parents=True, exist_ok=True)
    # Unchanged documents are skipped, so a second run only checks.
    _run([RAGSVC, "ingest", str(corpus), "--collection", "xquad", "--format", "beir"],
         {**os.environ, **env, "RAGSVC_DATA_DIR": str(data_dir)})
    return data_dir, env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", action="append", required=True, metavar="NAME[@REV][,KEY=VALUE...]",
                        help="A server to compare (repeat: two or more).")
    parser.add_argument("--questions", type=int, default=400, help="The first N XQuAD questions (default 400).")
    parser.add_argument("--rounds", type=int, default=2, help="Passes over the questions; the last is timed.")
    args = parser.parse_args()
    try:
        servers = [parse_server(spec) for spec in args.server]
    except ValueError as exc:
        parser.error(str(exc))
    if len(servers) < 2 or len({s.name for s in servers}) != len(servers):
        parser.error("give two or more servers, each with its own name")
    if args.questions < 20 or args.rounds < 1:
        parser.error("--questions must be at least 20 (a p95 needs them) and --rounds at least 1")

    dataset = xquad()  # writes the paragraphs as a BEIR corpus under .bench-data
    rows = xquad_rows()[: args.questions]
    prepared = {s.name: prepare(s, dataset.corpus) for s in servers}
    calibration = [window_calibration()]
    walls: dict[str, list[float]] = {s.name: [] for s in servers}
    steps: dict[str, dict[str, list[float]]] = {s.name: {} for s in servers}
    shorts = dict.fromkeys(walls, 0)
    outside: dict[str, list[float]] = {s.name: [] for s in servers}
    with ExitStack() as stack:
        clients = {}
        for name, (data_dir, env) in prepared.items():
            base = stack.enter_context(serve(data_dir, **env))
            clients[name] = stack.enter_context(httpx.Client(base_url=base, timeout=60))
        for client in clients.values():
            client.post("/v1/query", json={"question": "warm up", "collection": "xquad"}).raise_for_status()
        for round_ in range(args.rounds):
            timed = round_ == args.rounds - 1
            for i, row in enumerate(rows):
                for name, client in order(list(clients.items()), i, seed=round_):
                    started = time.perf_counter()
                    response = client.post("/v1/query", json={"question": row["question"], "collection": "xquad"})
                    elapsed = (time.perf_counter() - started) * 1000
                    response.raise_for_status()
                    if timed:
                        body = response.json()
                        walls[name].append(elapsed)
                        shorts[name] += body.get("short_answer") is not None
                        for step, ms in (body.get("timings_ms") or {}).items():
                            steps[name].setdefault(step, []).append(ms)
                        if "total" in (body.get("timings_ms") or {}):
                            # What the request spends outside the pipeline: HTTP, middleware,
                            # what is stored or logged after the answer.
                            outside[name].append(elapsed - body["timings_ms"]["total"])
    calibration.append(window_calibration())

    figures = {"benchmark": "side_by_side", "questions": len(rows), "rounds": args.rounds,
               "calibration_chunks_per_s": calibration, "servers": {}}
    print(f"calibration (raw embedder, chunks/s) before / after: {calibration}")
    for server in servers:
        wall = latency(walls[server.name])
        # Steps most requests ran: a clarification runs no retrieval or generation, and only a
        # multi-part question a second retrieval.
        by_step = {step: latency(ms) for step, ms in steps[server.name].items() if len(ms) >= len(rows) / 2}
        short_rate = round(shorts[server.name] / len(rows), 4)
        beyond = latency(outside[server.name]) if outside[server.name] else None
        figures["servers"][server.name] = {"ref": server.ref, "env": server.env, "round_trip_ms": wall,
                                           "steps_ms": by_step, "outside_pipeline_ms": beyond,
                                           "short_answer_rate": short_rate}
        print(f"{server.name:24s} p50 {wall['p50_ms']:6.1f}  p95 {wall['p95_ms']:6.1f}  "
              f"mean {wall['mean_ms']:6.1f} ms  short answers {short_rate:.3f}")
        print("    " + "  ".join(f"{step} {p['p50_ms']}/{p['p95_ms']}" for step, p in by_step.items())
              + (f"  outside the pipeline {beyond['p50_ms']}/{beyond['p95_ms']}" if beyond else ""))
    # Each server's p95 against the first's, question by question (the first is the baseline).
    baseline = servers[0].name
    for server in servers[1:]:
        against = p95_gap(walls[baseline], walls[server.name])
        figures["servers"][server.name]["p95_gap_over_first_ms"] = against
        print(f"{server.name:24s} p95 {against['gap_ms']:+.1f} ms over {baseline} "
              f"(95% paired bootstrap interval {against['low_ms']:+.1f} to {against['high_ms']:+.1f})")
    figures.update({"date": datetime.now(UTC).isoformat(timespec="seconds"),
                    "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                                "python": platform.python_version()}})
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
