"""The logistic regressions the answerability and short-answer trainings fit (scikit-learn), as
the service's LinearModel."""

from __future__ import annotations

import numpy as np
from sklearn.linear_model import LogisticRegression

from rag_service.pipeline.generation.answerability import FEATURES, impute
from rag_service.providers.rerankers import LinearModel


def fit(x: np.ndarray, y: np.ndarray, features: tuple[str, ...] = FEATURES) -> LinearModel:
    # Unknown features (NaN: no semantic search, no cosines) are imputed with the mean, as at run time.
    mean = np.nanmean(x, axis=0)
    x = np.where(np.isnan(x), mean, x)
    scale = x.std(axis=0)
    scale[scale == 0] = 1.0
    model = LogisticRegression(C=1.0, max_iter=2000).fit((x - mean) / scale, y)
    return LinearModel(features, mean, scale, model.coef_[0], float(model.intercept_[0]), trained_on="")


def probabilities(model: LinearModel, x: np.ndarray) -> np.ndarray:
    return model.probabilities(impute(x, model))
