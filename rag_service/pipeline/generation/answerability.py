"""Does the retrieved evidence answer the question? A small learned model over evidence that
generalises across collections (pure, apart from loading its weights once).

The features say whether the question's focus is matched where the answer would be: how much of
its content (IDF-weighted within the retrieved sentences, and plainly) the best sentence holds, how
much the whole context holds, whether the names and numbers it mentions appear, whether adjacent
question terms appear together, whether the best sentence holds the kind of fact asked for (a
number for "how many", a date for "when", a name for "who"), how close the best chunk is to the
question in embedding space and how far it stands out from the rest, how far the best candidate
stands out in the reranker's and the keyword search's score distributions, by how much the
best sentence beats the best one in any other document, how far the span reader's best answer in
the best sentence stands above its "no answer" (providers/reader.py, a reader trained on SQuAD's
train split). Features that cannot be computed (no semantic search, no reranker, no reader) are
unknown and read as their training mean.

Near the threshold, and below it, the generator takes a second look (three more features, read by a
second pair of models): how closely the passage around the best sentence matches the question
token by token in the local encoder's space (alignment.py), and the reader's better gap over the
best sentence and the runner-up the selection ranked (selection.SECOND_LOOK_SENTENCES). The best
sentence by shared words misses the answer's sentence for about one answerable question in five,
and the reader's "no answer" on it then looks like an unanswerable question's; reading the
runner-up finds the answer where it is.
Out of fold on XQuAD the second look with the runner-up's read abstained without the paragraph about
a point more than the alignment alone at the answered rate the training aims for, and about 2 more
at the least the goal allows (docs/benchmarks.md); it costs an encoder call and a read, so it is taken
only where the first look may be wrong.

A logistic regression over them (``benchmarks/train_answerability.py``, trained on questions built
from XQuAD: each question against the full collection, labelled by whether the first citation is
the paragraph holding the answer, and against the collection without that paragraph, labelled 0)
gives the probability that the answer's first cited passage holds the answer; below a threshold the
generator says the documents do not appear to answer. The answer's confidence is a second logistic
regression over the same features, trained on the answerable questions only, so that it is
calibrated where answers are given (a model fitted on the mixture under-states it there): the
training script reports the expected calibration error under article-grouped cross-validation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np

from rag_service.providers.rerankers import LinearModel
from rag_service.text.questions import Focus, focus, has_new_fact
from rag_service.text.terms import terms

FEATURES = ("best_coverage", "best_share", "chunk_share", "context_share", "entity_best", "entity_chunk",
            "entity_context", "has_entities", "pair_best", "pair_chunk", "kind_asked", "kind_missing", "cosine_top",
            "cosine_gap", "terms_log", "margin", "rare_missing", "rerank_gap", "keyword_gap", "reader_gap")
# With RAGSVC_ANSWER_TOKEN_ALIGNMENT on, a second pair of models also reads the second look: the
# token alignment and the reader's better gap over the best sentence and the runner-up.
ALIGNED_FEATURES = (*FEATURES, "align_mean", "align_worst", "reader_gap_top")
MODEL_FILE = "answerability.json"
MAX_CONFIDENCE = 0.99
CONFIDENCE_FILE = "answer_confidence.json"
ALIGNED_MODEL_FILE = "answerability_aligned.json"
ALIGNED_CONFIDENCE_FILE = "answer_confidence_aligned.json"
# The second look costs an encoder call and a read, so it is taken only where the default
# model's log-odds are less than SECOND_LOOK_BELOW under the abstention threshold's or less than
# SECOND_LOOK_ABOVE over them. Below the threshold is where an answerable question whose best
# sentence is not the answer's lands; far above it the second look almost never decides otherwise.
# The band is chosen from train_answerability.py's cascade report: about as many full-collection
# questions look twice as did with the alignment alone (about 4%), so they do not set the p95.
SECOND_LOOK_BELOW = 3.0
SECOND_LOOK_ABOVE = 0.25
# The reader's gap in logits, clipped: beyond this it says nothing more (and a passage it could not
# read at all reads as the lowest).
READER_GAP_LIMIT = 15.0


@dataclass(frozen=True)
class Evidence:
    """What the generator found, as the model reads it."""

    question: str
    best_sentence: str
    best_chunk: str            # the chunk it is in
    best_coverage: float       # IDF-weighted share of the question's terms in the best sentence
    other_coverage: float      # the same for the best sentence of any other document (0 when none)
    context: Sequence[str]     # the retrieved chunks' texts, in rank order
    idf: Mapping[str, float]   # term weights within the retrieved sentences
    cosines: Sequence[float]   # query-chunk cosine per retrieved chunk, where the semantic search scored it
    rerank_scores: Sequence[float] = ()   # the reranker's score per retrieved chunk, where it ran
    keyword_scores: Sequence[float] = ()  # BM25 per retrieved chunk, where the keyword search found it
    # alignment.alignment() of the question with the best sentence's passage, where a local encoder ran
    alignment: tuple[float, float] | None = None
    # the span reader's gap (best span over "no answer") in the best sentence, where it ran
    reader_gap: float | None = None
    # its best gap over the best sentence and the selection's runners-up, where a second look read them
    reader_gap_top: float | None = None


@dataclass(frozen=True)
class Assessment:
    probability: float  # that the evidence answers (the abstention decision reads this)
    confidence: float   # that the first cited passage holds the answer, calibrated on answerable questions
    features: dict[str, float]


def _share(wanted: frozenset[str], present: set[str], empty: float = 1.0) -> float:
    """The share of ``wanted`` that is ``present``; ``empty`` when nothing is wanted."""
    return len(wanted & present) / len(wanted) if wanted else empty


def standout(scores: Sequence[float]) -> float:
    """How far the best score stands above the second, in standard deviations of all of them: scale
    free, so it reads a Cohere relevance and the local ranker's logit alike. NaN (unknown) with
    fewer than three scores."""
    if len(scores) < 3:
        return math.nan
    ranked = sorted(scores, reverse=True)
    spread = float(np.std(ranked))
    return (ranked[0] - ranked[1]) / spread if spread > 0 else 0.0


def features(evidence: Evidence, asked: Focus | None = None) -> np.ndarray:
    """One row of ALIGNED_FEATURES (a pure function of the evidence; the first len(FEATURES)
    columns are FEATURES, the alignment's are NaN without one)."""
    asked = asked or focus(evidence.question)
    best_terms = terms(evidence.best_sentence)
    chunk_terms = terms(evidence.best_chunk)
    best_set, chunk_set = set(best_terms), set(chunk_terms)
    context_set = {t for text in evidence.context for t in terms(text)}
    # Without a semantic search in the route there are no cosines: the two features are unknown
    # (NaN), and assess() reads them as the training mean, i.e. as no evidence either way.
    cosines = sorted(evidence.cosines, reverse=True)
    top = cosines[0] if cosines else math.nan
    rest = float(np.median(cosines[1:])) if len(cosines) > 1 else top
    kind_missing = asked.kind is not None and not has_new_fact(asked.kind, evidence.best_sentence, evidence.question)
    # The rarest question term the best chunk lacks, relative to the rarest there could be (its
    # weight is learned together with the coverage features it overlaps with).
    unseen = max(evidence.idf.values(), default=1.0) + 1.0
    missing = [evidence.idf.get(t, unseen) for t in asked.terms - chunk_set]
    row = {
        "best_coverage": evidence.best_coverage,
        # A question without content terms ("What is it?") matches nothing: no evidence it is answered.
        "best_share": _share(asked.terms, best_set, empty=0.0),
        "chunk_share": _share(asked.terms, chunk_set, empty=0.0),
        "context_share": _share(asked.terms, context_set, empty=0.0),
        "entity_best": _share(asked.entities, best_set),
        "entity_chunk": _share(asked.entities, chunk_set),
        "entity_context": _share(asked.entities, context_set),
        "has_entities": float(bool(asked.entities)),
        "pair_best": _share(asked.pairs, set(zip(best_terms, best_terms[1:], strict=False))),
        "pair_chunk": _share(asked.pairs, set(zip(chunk_terms, chunk_terms[1:], strict=False))),
        "kind_asked": float(asked.kind is not None),
        "kind_missing": float(kind_missing),
        "cosine_top": top,
        "cosine_gap": top - rest,
        "terms_log": math.log1p(len(asked.terms)),
        "margin": evidence.best_coverage - evidence.other_coverage,
        "rare_missing": max(missing, default=0.0) / unseen,
        "rerank_gap": standout(evidence.rerank_scores),
        "keyword_gap": standout(evidence.keyword_scores),
        "reader_gap": _clipped_gap(evidence.reader_gap),
        "align_mean": evidence.alignment[0] if evidence.alignment else math.nan,
        "align_worst": evidence.alignment[1] if evidence.alignment else math.nan,
        "reader_gap_top": _clipped_gap(evidence.reader_gap_top),
    }
    return np.array([row[name] for name in ALIGNED_FEATURES], dtype=np.float64)


def _clipped_gap(gap: float | None) -> float:
    return math.nan if gap is None else min(max(gap, -READER_GAP_LIMIT), READER_GAP_LIMIT)


@cache
def default_model(aligned: bool = False) -> LinearModel:
    if aligned:
        return LinearModel.load(resource=ALIGNED_MODEL_FILE, features=ALIGNED_FEATURES)
    return LinearModel.load(resource=MODEL_FILE, features=FEATURES)


@cache
def confidence_model(aligned: bool = False) -> LinearModel:
    if aligned:
        return LinearModel.load(resource=ALIGNED_CONFIDENCE_FILE, features=ALIGNED_FEATURES)
    return LinearModel.load(resource=CONFIDENCE_FILE, features=FEATURES)


def _sigmoid(logit: float) -> float:
    return 1.0 / (1.0 + math.exp(-logit))


def assess(evidence: Evidence, model: LinearModel | None = None, confidence: LinearModel | None = None) -> Assessment:
    """The models' reading of the evidence: whether it answers, and the answer's confidence (the
    aligned pair when the evidence carries a second look: the token alignment, which the aligned
    models were trained with on every example, and the runner-up's read where the reader ran)."""
    aligned = evidence.alignment is not None
    model, confidence = model or default_model(aligned), confidence or confidence_model(aligned)
    row = features(evidence)[None, :len(model.features)]
    # Never certain: the models extrapolate beyond what they were trained on.
    return Assessment(probability=_sigmoid(float(model.score(impute(row, model))[0])),
                      confidence=min(MAX_CONFIDENCE, _sigmoid(float(confidence.score(impute(row, confidence))[0]))),
                      features={name: round(float(v), 4) for name, v in zip(model.features, row[0], strict=True)
                                if not math.isnan(v)})


def undecided(probability: float, threshold: float, below: float = SECOND_LOOK_BELOW,
              above: float = SECOND_LOOK_ABOVE) -> bool:
    """Whether ``probability``'s log-odds are less than ``below`` under the abstention
    ``threshold``'s and less than ``above`` over them: where a second look is taken (never at a
    threshold of 0 or 1: those decide without a model)."""
    if not 0 < threshold < 1:
        return False
    p = min(max(probability, 1e-9), 1 - 1e-9)
    distance = math.log(p / (1 - p)) - math.log(threshold / (1 - threshold))
    return -below < distance < above


def impute(rows: np.ndarray, model: LinearModel) -> np.ndarray:
    """Unknown features (NaN) set to the model's training mean: they then add nothing to the score."""
    return np.where(np.isnan(rows), model.mean, rows)
