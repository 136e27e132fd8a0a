"""The side-by-side benchmark's server specs and rotation (benchmarks/side_by_side.py)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from benchmarks import side_by_side
from benchmarks.ir import latency
from benchmarks.side_by_side import Server, commit_of, order, p95_gap, parse_server


def test_a_server_spec_names_a_code_and_its_settings() -> None:
    assert parse_server("default") == Server(name="default")
    assert parse_server("before@020630c") == Server(name="before", ref="020630c")
    assert parse_server("entities, RAGSVC_ANSWER_SHORT_ANSWER_PARSE = entities,RAGSVC_RATE_LIMIT=a=b") == Server(
        name="entities", env={"RAGSVC_ANSWER_SHORT_ANSWER_PARSE": "entities", "RAGSVC_RATE_LIMIT": "a=b"})
    # Another commit may have settings this code does not know.
    assert parse_server("old@HEAD~3,RAGSVC_SOMETHING_OLD=1") == Server(
        name="old", ref="HEAD~3", env={"RAGSVC_SOMETHING_OLD": "1"})


@pytest.mark.parametrize("spec, problem", [
    ("@020630c", "needs a name"), (",RAGSVC_X=1", "needs a name"), ("before@", "followed by a commit"),
    ("x,RAGSVC_X", "is not KEY=VALUE"), ("x,=1", "is not KEY=VALUE"),
    ("x,HOME=/tmp", "not a setting"), ("x,RAGSVC_DATA_DIR=/tmp/d", "not a setting"),
    ("x,RAGSVC_ANSWER_SHORT_ANSWER_PARSER=full", "no setting of this code"),
])
def test_a_bad_spec_says_what_is_wrong(spec: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_server(spec)


def test_each_server_goes_first_and_follows_each_other_about_equally_often() -> None:
    servers = ["a", "b", "c", "d"]
    orders = [order(servers, i) for i in range(400)]
    assert all(sorted(o) == servers for o in orders) and order(servers, 7) == order(servers, 7)
    firsts = Counter(o[0] for o in orders)
    follows = Counter((x, y) for o in orders for x, y in zip(o, o[1:], strict=False))
    assert min(firsts.values()) > 70 and max(firsts.values()) < 130  # 100 each expected
    assert len(follows) == 12 and min(follows.values()) > 60  # 100 each expected; a fixed rotation gives 0 for half
    assert order(servers, 3, seed=1) != order(servers, 3, seed=0) or order(servers, 4, seed=1) != order(servers, 4)


def test_commit_of_names_a_commit_by_its_hash() -> None:
    assert len(commit_of("HEAD")) == 40
    with pytest.raises(SystemExit, match="names no commit"):
        commit_of("no-such-branch-anywhere")


def test_a_server_imports_its_own_tree_whatever_the_callers_pythonpath(monkeypatch: pytest.MonkeyPatch,
                                                                       tmp_path: Path) -> None:
    runs: list[list[str]] = []
    monkeypatch.setattr(side_by_side, "DATA_DIRS", tmp_path / "data")
    monkeypatch.setattr(side_by_side, "WORKTREES", tmp_path / "trees")
    monkeypatch.setattr(side_by_side, "_run", lambda args, env: runs.append(args) or "")
    monkeypatch.setenv("PYTHONPATH", "/somewhere/else")
    data_dir, env = side_by_side.prepare(Server(name="now"), tmp_path / "corpus.jsonl")
    assert env["PYTHONPATH"] == str(side_by_side.ROOT) and data_dir.name.startswith(commit_of("HEAD"))
    assert runs[-1][1:3] == ["ingest", str(tmp_path / "corpus.jsonl")]
    head = commit_of("HEAD")
    monkeypatch.setattr(side_by_side, "_run", lambda args, env: runs.append(args) or (head if "rev-parse" in args
                                                                                       else ""))
    data_dir, env = side_by_side.prepare(Server(name="then", ref="HEAD"), tmp_path / "corpus.jsonl")
    assert env["PYTHONPATH"] == str(tmp_path / "trees" / head) and data_dir.name == head
    assert any(a[3:5] == ["worktree", "add"] for a in runs)


def test_the_latency_summary_is_numpys_percentiles() -> None:
    values = [float(v) for v in range(1, 101)]
    assert latency(values) == {"p50_ms": 50.5, "p95_ms": 95.05, "mean_ms": 50.5}


def test_the_p95_gap_comes_with_a_paired_interval() -> None:
    rng = np.random.default_rng(3)
    before = list(rng.lognormal(3.5, 0.3, 400))
    # A server 5 ms slower on every question: the gap is 5 ms and every resample says so.
    assert p95_gap(before, [ms + 5 for ms in before]) == {"gap_ms": 5.0, "low_ms": 5.0, "high_ms": 5.0}
    # Noise of its own: the interval holds the gap and is wide enough to say how sure it is.
    noisy = p95_gap(before, [ms + 5 + rng.normal(0, 8) for ms in before])
    assert noisy["low_ms"] < noisy["gap_ms"] < noisy["high_ms"] and noisy["high_ms"] - noisy["low_ms"] > 2
    assert p95_gap(before, list(before)) == {"gap_ms": 0.0, "low_ms": 0.0, "high_ms": 0.0}
    with pytest.raises(ValueError, match="same questions"):
        p95_gap(before, before[:-1])
    with pytest.raises(ValueError, match="at least 20"):
        p95_gap(before[:19], before[:19])
