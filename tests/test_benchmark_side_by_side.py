"""The side-by-side benchmark's server specs and rotation (benchmarks/side_by_side.py)."""

from __future__ import annotations

import pytest

from benchmarks.side_by_side import Server, parse_server, percentiles, rotated


def test_a_server_spec_names_a_code_and_its_settings() -> None:
    assert parse_server("default") == Server(name="default")
    assert parse_server("before@020630c") == Server(name="before", ref="020630c")
    assert parse_server("entities, RAGSVC_ANSWER_SHORT_ANSWER_PARSE=entities,RAGSVC_X=a=b") == Server(
        name="entities", env={"RAGSVC_ANSWER_SHORT_ANSWER_PARSE": "entities", "RAGSVC_X": "a=b"})
    assert parse_server("old@HEAD~3,RAGSVC_ANSWER_TOKEN_ALIGNMENT=false").ref == "HEAD~3"


@pytest.mark.parametrize("spec, problem", [
    ("@020630c", "needs a name"), (",RAGSVC_X=1", "needs a name"), ("before@", "followed by a commit"),
    ("x,RAGSVC_X", "is not KEY=VALUE"), ("x,=1", "is not KEY=VALUE"),
])
def test_a_bad_spec_says_what_is_wrong(spec: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_server(spec)


def test_each_server_goes_first_in_turn() -> None:
    firsts = [rotated(["a", "b", "c"], i)[0] for i in range(6)]
    assert firsts == ["a", "b", "c", "a", "b", "c"]
    assert sorted(rotated(["a", "b", "c"], 4)) == ["a", "b", "c"] and rotated([], 3) == []


def test_percentiles_are_numpys() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentiles(values) == {"p50": 50.5, "p95": 95.0, "mean": 50.5}
