"""Weighted reciprocal-rank fusion as a pure function."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rag_service.domain import SearchHit
from rag_service.pipeline.retrieval.fusion import RankedList, reciprocal_rank_fusion

DOC = uuid.uuid4()
IDS = [uuid.UUID(int=i + 1) for i in range(20)]


def hit(i: int, score: float = 1.0) -> SearchHit:
    return SearchHit(chunk_id=IDS[i], document_id=DOC, parent_id=None, ordinal=i, source_uri="t://d", title=None,
                     text=f"chunk {i}", start_char=0, end_char=7, score=score)


def test_agreement_beats_a_single_first_place() -> None:
    fused = reciprocal_rank_fusion([
        RankedList("semantic", [hit(0), hit(1)]),
        RankedList("keyword", [hit(2), hit(1)]),
    ], weights={}, k=60)
    assert [c.hit.chunk_id for c in fused][0] == IDS[1]
    assert fused[0].fused_score == pytest.approx(2 / 62)
    assert fused[0].ranks == {"semantic": 2, "keyword": 2}


def test_weights_scale_votes_and_scores_are_kept_per_strategy() -> None:
    fused = reciprocal_rank_fusion([
        RankedList("semantic", [hit(0, 0.9)]),
        RankedList("keyword", [hit(1, 7.5)]),
    ], weights={"keyword": 2.0}, k=10)
    assert [c.hit.chunk_id for c in fused] == [IDS[1], IDS[0]]
    assert fused[0].fused_score == pytest.approx(2 / 11)
    assert fused[0].scores == {"keyword": 7.5}
    assert fused[1].scores == {"semantic": 0.9}


def test_variant_lists_vote_less_and_ranks_keep_the_best() -> None:
    fused = reciprocal_rank_fusion([
        RankedList("semantic", [hit(0), hit(1)]),
        RankedList("semantic", [hit(1), hit(0)], weight_factor=0.5),
    ], weights={}, k=0)
    assert fused[0].hit.chunk_id == IDS[0]  # 1/1 + 0.5/2 > 1/2 + 0.5/1
    assert fused[1].ranks == {"semantic": 1}


def test_a_list_naming_a_chunk_twice_votes_once() -> None:
    fused = reciprocal_rank_fusion([RankedList("pattern", [hit(0), hit(0)])], weights={}, k=60)
    assert len(fused) == 1 and fused[0].fused_score == pytest.approx(1 / 61)


def test_negative_k_is_refused() -> None:
    with pytest.raises(ValueError, match="k"):
        reciprocal_rank_fusion([], weights={}, k=-1)


@given(st.lists(st.lists(st.integers(0, 19), max_size=15), max_size=4), st.integers(0, 100))
def test_fusion_invariants(lists: list[list[int]], k: int) -> None:
    ranked = [RankedList(f"s{n}", [hit(i) for i in items]) for n, items in enumerate(lists)]
    fused = reciprocal_rank_fusion(ranked, weights={}, k=k)
    expected = {IDS[i] for items in lists for i in items}
    assert [c.hit.chunk_id for c in fused] == list(dict.fromkeys(c.hit.chunk_id for c in fused))  # no duplicates
    assert {c.hit.chunk_id for c in fused} == expected
    assert all(a.fused_score >= b.fused_score for a, b in zip(fused, fused[1:], strict=False))
    for c in fused:
        for name, rank in c.ranks.items():
            items = lists[int(name[1:])]
            assert items.index(int(c.hit.chunk_id.int) - 1) + 1 == rank
    # Deterministic: the same input gives the same order.
    assert [c.hit.chunk_id for c in reciprocal_rank_fusion(ranked, weights={}, k=k)] == [c.hit.chunk_id for c in fused]
