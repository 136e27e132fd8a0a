"""Offline evaluation (datasets, retrieval metrics, the seven-metric scorer, reports).

Thin for now: the evaluation issue fills this package.
"""
