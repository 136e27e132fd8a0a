"""Cohen's kappa: a hand-computed example, the undefined cases, and scikit-learn as the reference."""

from __future__ import annotations

import math
import warnings

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rag_service.review.agreement import cohen_kappa

try:  # not a dependency of the service: only the reference implementation for this test
    from sklearn import metrics as sklearn_metrics
except ImportError:  # pragma: no cover
    sklearn_metrics = None


def test_the_textbook_example() -> None:
    # 50 items: both yes 20, A yes/B no 5, A no/B yes 10, both no 15.
    # p_o = 35/50 = 0.7; A says yes 0.5, B 0.6: p_e = 0.5*0.6 + 0.5*0.4 = 0.5; kappa = 0.2/0.5 = 0.4.
    a = [True] * 20 + [True] * 5 + [False] * 10 + [False] * 15
    b = [True] * 20 + [False] * 5 + [True] * 10 + [False] * 15
    result = cohen_kappa(a, b)
    assert result.n == 50
    assert result.observed == pytest.approx(0.7) and result.expected == pytest.approx(0.5)
    assert result.kappa == pytest.approx(0.4)


def test_perfect_and_opposite_agreement() -> None:
    assert cohen_kappa([True, False, True], [True, False, True]).kappa == pytest.approx(1.0)
    assert cohen_kappa([True, False], [False, True]).kappa == pytest.approx(-1.0)


def test_undefined_kappa_is_none_never_a_number() -> None:
    assert cohen_kappa([], []).kappa is None and cohen_kappa([], []).n == 0
    # Both raters constant and equal: p_e = 1.
    constant = cohen_kappa([True] * 4, [True] * 4)
    assert constant.kappa is None and constant.n == 4 and constant.observed == 1.0
    with pytest.raises(ValueError, match="same items"):
        cohen_kappa([True], [True, False])


@pytest.mark.skipif(sklearn_metrics is None, reason="scikit-learn is not installed (a test-only reference)")
@given(st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=60))
def test_agrees_with_scikit_learn(pairs: list[tuple[bool, bool]]) -> None:
    a, b = [x for x, _ in pairs], [y for _, y in pairs]
    ours = cohen_kappa(a, b).kappa
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scikit-learn warns, then answers nan, where kappa is undefined
        theirs = sklearn_metrics.cohen_kappa_score(a, b)
    if ours is None:
        assert math.isnan(theirs)
    else:
        assert ours == pytest.approx(theirs, abs=1e-12)
