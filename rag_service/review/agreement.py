"""Judge-human agreement (pure): Cohen's kappa between two raters' labels of the same items.

Cohen, J. (1960). A coefficient of agreement for nominal scales. Educational and Psychological
Measurement 20(1), 37-46:

    kappa = (p_o - p_e) / (1 - p_e)

where p_o is the share of items the raters label alike and p_e the agreement expected by chance,
sum over labels of (share rater A gave it) x (share rater B gave it). Kappa is undefined when
p_e = 1 (both raters gave every item the same single label) and when there are no items: then
``kappa`` is None, never a made-up value.

For the review queue the raters are "the scorer flagged metric m" and "the reviewer rejected or
edited the answer", over decided items. Only queued answers are ever decided, so this measures
agreement among answers that reached a reviewer, not over all traffic.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Agreement:
    kappa: float | None
    n: int
    observed: float | None  # p_o
    expected: float | None  # p_e


def cohen_kappa(a: Sequence[Hashable], b: Sequence[Hashable]) -> Agreement:
    """Cohen's kappa of two equally long label sequences (any hashable labels)."""
    if len(a) != len(b):
        raise ValueError(f"both raters must label the same items: {len(a)} labels against {len(b)}")
    n = len(a)
    if n == 0:
        return Agreement(kappa=None, n=0, observed=None, expected=None)
    labels = sorted(set(a) | set(b), key=repr)
    index = {label: i for i, label in enumerate(labels)}
    confusion = np.zeros((len(labels), len(labels)), dtype=np.float64)
    np.add.at(confusion, ([index[x] for x in a], [index[y] for y in b]), 1.0)
    confusion /= n
    observed = float(np.trace(confusion))
    expected = float(confusion.sum(axis=1) @ confusion.sum(axis=0))
    if np.isclose(expected, 1.0):
        return Agreement(kappa=None, n=n, observed=observed, expected=expected)
    return Agreement(kappa=(observed - expected) / (1.0 - expected), n=n, observed=observed, expected=expected)
