"""Per-item metrics of an offline evaluation run: retrieval (ranx), SQuAD v1.1 answer overlap, and ragas.

Each item gets plain numbers, stored per item and aggregated later. Established implementations are used
rather than our own formulas, so the figures compare with published ones. ragas and ranx are optional
(the ``eval`` extra) and imported on first use: ragas takes ~4-5 s, ranx loads (or compiles) numba code.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import math
import re
import string
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from types import SimpleNamespace
from typing import Any

from rag_service.domain.eval_runs import IR_METRICS, RAGAS_OFFLINE_METRICS, SQUAD_METRICS
from rag_service.scoring.ragas_scores import Embed, RagasConfig, load_ragas

EVAL_EXTRA = "pip install -e '.[eval]'"
NO_RESULT = "__no_result__"  # ranx needs an entry for every query; this id is never relevant
RAGAS_LLM_METRICS = ("ragas_llm_context_recall", "ragas_llm_context_precision", "ragas_llm_answer_correctness")
SQUAD_SCORER = "squad-v1.1"
SCORERS = {  # metric -> the ragas class (and settings) that computes it
    "ragas_exact_match": "ragas:ExactMatch", "ragas_rouge_l": "ragas:RougeScore(rougeL)",
    "ragas_bleu": "ragas:BleuScore", "ragas_semantic_similarity": "ragas:SemanticSimilarity",
    "ragas_context_precision": "ragas:NonLLMContextPrecisionWithReference",
    "ragas_context_recall": "ragas:NonLLMContextRecall", "ragas_llm_context_recall": "ragas:ContextRecall",
    "ragas_llm_context_precision": "ragas:ContextPrecisionWithReference",
    "ragas_llm_answer_correctness": "ragas:AnswerCorrectness",
}
log = logging.getLogger(__name__)
_DEPTH = max(int(metric.split("@")[1]) for metric in IR_METRICS)  # no IR metric looks further down

# --- retrieval --------------------------------------------------------------------------------------


def ranking(doc_ids: Iterable[str]) -> dict[str, float]:
    """Documents in first-occurrence order with descending scores, as ranx wants a run: chunks of one
    document collapse to its best rank, and an empty ranking becomes a never-relevant placeholder."""
    order = list(dict.fromkeys(doc_ids))
    return {doc: float(len(order) - rank) for rank, doc in enumerate(order)} or {NO_RESULT: 0.0}


def relevant_rank(relevant: Mapping[str, int], ranking: Sequence[str]) -> int | None:
    """1-based rank of the first document judged relevant (relevance > 0), duplicates collapsed as
    ranx sees them; None when none was retrieved. It says where an item's retrieval went wrong."""
    for rank, doc in enumerate(dict.fromkeys(ranking), start=1):
        if relevant.get(doc, 0) > 0:
            return rank
    return None


def ir_metrics(qrels: Mapping[str, Mapping[str, int]],
               rankings: Mapping[str, Sequence[str]]) -> dict[str, dict[str, float]]:
    """IR_METRICS per item of ``rankings`` (document ids, best first), by ranx in one batch (a call per
    item would pay ranx's conversion overhead each time). Items with no positively judged document are
    left out: every one of these metrics is undefined without a relevant document."""
    positive = {item: {doc: rel for doc, rel in qrels.get(item, {}).items() if rel > 0} for item in rankings}
    judged = {item: relevant for item, relevant in positive.items() if relevant}
    if not judged:
        return {}
    try:
        from ranx import evaluate
    except ImportError as exc:
        raise ImportError(f"ranx computes the IR metrics; install it with {EVAL_EXTRA}") from exc
    # Cut at the deepest cutoff: the metrics cannot change, and ranx's conversion is most of the cost.
    run = {item: ranking(itertools.islice(dict.fromkeys(rankings[item]), _DEPTH)) for item in judged}
    # Plain dicts skip building ranx's Qrels/Run (numba typed dicts); ranx reads both in their (shared)
    # key order, so the i-th score belongs to the i-th item.
    scores = evaluate(judged, run, list(IR_METRICS), return_mean=False, save_results_in_run=False)
    return {item: {metric: float(scores[metric][i]) for metric in IR_METRICS} for i, item in enumerate(judged)}


def warm_up_ir_metrics() -> None:
    """Import ranx and score one item, which loads (or compiles) its numba code: seconds on first use.
    Runners call it, in a thread, before items run concurrently: paid inside the first item it blocks
    the event loop, and the other items' reranker timeouts fire on a wait they did not cause. It never
    fails the run: without ranx, or when ranx fails, the items record why their IR metrics are missing."""
    try:
        ir_metrics({"warm-up": {"doc": 1}}, {"warm-up": ["doc"]})
    except ImportError:
        pass
    except Exception:
        log.warning("ranx did not warm up; the items will try it themselves", exc_info=True)


# --- SQuAD v1.1 -------------------------------------------------------------------------------------

_PUNCTUATION = frozenset(string.punctuation)


def normalize(text: str) -> str:
    """SQuAD v1.1's answer normalisation (lowercase, no punctuation, no articles, single spaces), so an
    answer that differs from a reference only in form still matches."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def token_f1(prediction: str, reference: str) -> float:
    """SQuAD's token F1 after normalisation: partial credit for a partly right answer."""
    pred, ref = normalize(prediction).split(), normalize(reference).split()
    same = sum((collections.Counter(pred) & collections.Counter(ref)).values())
    # 2PR / (P + R) with P = same/|pred| and R = same/|ref| is 2·same / (|pred| + |ref|); two empty
    # answers agree (as in SQuAD's script).
    total = len(pred) + len(ref)
    return 2 * same / total if total else float(pred == ref)


def best_match(prediction: str, references: Sequence[str]) -> tuple[float, float, str]:
    """(exact match, F1, the reference that scored best): SQuAD credits the closest reference."""
    if not references:
        raise ValueError("best_match needs at least one reference answer")
    scored = [(float(normalize(prediction) == normalize(r)), token_f1(prediction, r), r) for r in references]
    return max(scored, key=lambda s: (s[1], s[0]))


def squad_scores(prediction: str | None, references: Sequence[str]) -> dict[str, float | None]:
    """SQUAD_METRICS of one answer; no answer scores as the empty string (0 against a real reference),
    and without references there is nothing to score (None)."""
    if not references:
        return dict.fromkeys(SQUAD_METRICS, None)
    exact, f1, _ = best_match(prediction or "", references)
    return dict(zip(SQUAD_METRICS, (exact, f1), strict=True))


# --- ragas ------------------------------------------------------------------------------------------

Scored = tuple[float | None, str]


@cache
def _import_metrics() -> SimpleNamespace:
    """ragas' metric classes; ImportError when ragas is missing (not cached, so a later install works)."""
    # rouge_score logs "Using default tokenizer" through absl at INFO on every score: one line per item.
    logging.getLogger("absl").setLevel(logging.WARNING)
    from ragas.dataset_schema import SingleTurnSample
    from ragas.metrics import _NonLLMContextPrecisionWithReference, _NonLLMContextRecall, collections
    return SimpleNamespace(collections=collections, Sample=SingleTurnSample,
                           PrecisionNonLLM=_NonLLMContextPrecisionWithReference, RecallNonLLM=_NonLLMContextRecall)


@cache
def _prefetched(wrapper: type) -> type:
    """ragas' SemanticSimilarity calls the *sync* ``embed_text``, which our async-only wrapper refuses (an
    async embedder cannot be awaited from sync code on a running loop). This subclass embeds the texts
    beforehand, in one batch through the wrapper's async path, and looks them up."""

    class Prefetched(wrapper):  # type: ignore[misc, valid-type]
        def __init__(self, embed: Embed) -> None:
            super().__init__(embed)
            self._known: dict[str, list[float]] = {}

        async def prefetch(self, texts: Sequence[str]) -> None:
            self._known.update(zip(texts, await self.aembed_texts(list(texts)), strict=True))

        def embed_text(self, text: str, **kwargs: Any) -> list[float]:
            return self._known[text]

    return Prefetched


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


def _skipped(scorer: str, why: str) -> Scored:
    return None, f"{scorer} (not scored: {why})"


async def _attempt(scorer: str, job: Callable[[], Awaitable[Any]]) -> Scored:
    """One metric's value in [0, 1], or None with the reason in the scorer string: a metric that fails
    (or whose dependency is missing) must not cost the item its other metrics."""
    try:
        result = await job()
    except ImportError as exc:
        return _skipped(scorer, f"{_first_line(exc)}; {EVAL_EXTRA}")
    except Exception as exc:  # ragas raises ValueError/AssertionError/instructor errors alike
        return _skipped(scorer, f"failed: {type(exc).__name__}: {_first_line(exc)}")
    value = getattr(result, "value", result)
    if value is None or math.isnan(value := float(value)):
        return _skipped(scorer, "ragas returned no value")
    return min(1.0, max(0.0, value)), scorer  # cosines can dip below 0; stored metrics live in [0, 1]


async def _best(scorer: str, references: Sequence[str], job: Callable[[str], Awaitable[Any]]) -> Scored:
    """The best value over the references, as SQuAD credits the closest one (each may be phrased
    differently); when all fail, the first failure says why."""
    results = [await _attempt(scorer, lambda ref=ref: job(ref)) for ref in references]
    values = [value for value, _ in results if value is not None]
    return (max(values), scorer) if values else results[0]


async def _load() -> tuple[SimpleNamespace, SimpleNamespace] | str:
    """(ragas_scores' loaded pieces, the metric classes), or why ragas cannot be used."""
    loaded = await load_ragas()  # also switches ragas' usage analytics off before ragas is imported
    if isinstance(loaded, str):
        return f"ragas is not installed; {EVAL_EXTRA}"
    try:
        return loaded, await asyncio.to_thread(_import_metrics)
    except ImportError as exc:
        return f"ragas could not be imported ({_first_line(exc)}); {EVAL_EXTRA}"


@dataclass(frozen=True)
class AnswerMetrics:
    """ragas 0.4's metrics of one item: the offline ones always (string overlap, our embedder's semantic
    similarity, string-similarity context precision/recall), the LLM-judged ones when ``llm`` is given.
    ``embed`` is our embedder's ``embed`` (None: no semantic similarity); each LLM request may take
    ``llm_timeout_s``."""

    embed: Embed | None = None
    llm: RagasConfig | None = None
    llm_timeout_s: float = 60.0

    @property
    def names(self) -> tuple[str, ...]:
        return RAGAS_OFFLINE_METRICS + (RAGAS_LLM_METRICS if self.llm else ())

    async def score(self, *, answer: str | None, references: Sequence[str], retrieved_contexts: Sequence[str],
                    reference_contexts: Sequence[str],
                    question: str | None = None) -> tuple[dict[str, float | None], dict[str, str]]:
        """(value per metric, scorer per metric); a None value says why in its scorer string. Answer
        metrics take the best over the references; the LLM metrics judge one reference (the one the
        answer matches best by SQuAD F1), since each reference costs several LLM calls."""
        loaded = await _load()
        if isinstance(loaded, str):
            return dict.fromkeys(self.names, None), {m: _skipped(SCORERS[m], loaded)[1] for m in self.names}
        pieces, ragas = loaded
        answer = (answer or "").strip()
        refs = list(dict.fromkeys(r.strip() for r in references if r.strip()))
        retrieved = [c for c in retrieved_contexts if c.strip()]
        expected = [c for c in reference_contexts if c.strip()]
        missing = "no answer" if not answer else "no reference answer" if not refs else None
        c, scored = ragas.collections, {}
        for name, metric in (("ragas_exact_match", c.ExactMatch()), ("ragas_bleu", c.BleuScore()),
                             ("ragas_rouge_l", c.RougeScore(rouge_type="rougeL", mode="fmeasure"))):
            scored[name] = _skipped(SCORERS[name], missing) if missing else await _best(
                SCORERS[name], refs, lambda ref, metric=metric: metric.ascore(reference=ref, response=answer))
        scored["ragas_semantic_similarity"] = await self._similarity(ragas, pieces, answer, refs, missing)
        scored.update(await _contexts(ragas, retrieved, expected))
        if self.llm is not None:
            scored.update(await self._llm_metrics(ragas, pieces, self.llm, (question or "").strip(), answer, refs,
                                                  retrieved))
        return {m: scored[m][0] for m in self.names}, {m: scored[m][1] for m in self.names}

    async def _similarity(self, ragas: SimpleNamespace, pieces: SimpleNamespace, answer: str, refs: list[str],
                          missing: str | None) -> Scored:
        scorer = SCORERS["ragas_semantic_similarity"]
        if missing or self.embed is None:
            return _skipped(scorer, missing or "no embedder was given")
        embeddings = _prefetched(pieces.Embeddings)(self.embed)
        try:
            await embeddings.prefetch([answer, *refs])
        except Exception as exc:  # the embedder's own failure: this metric only
            return _skipped(scorer, f"failed: {type(exc).__name__}: {_first_line(exc)}")
        metric = ragas.collections.SemanticSimilarity(embeddings=embeddings)
        return await _best(scorer, refs, lambda ref: metric.ascore(reference=ref, response=answer))

    async def _llm_metrics(self, ragas: SimpleNamespace, pieces: SimpleNamespace, config: RagasConfig, question: str,
                           answer: str, refs: list[str], retrieved: list[str]) -> dict[str, Scored]:
        missing = "no question" if not question else "no reference answer" if not refs else None
        if missing:
            return {name: _skipped(SCORERS[name], missing) for name in RAGAS_LLM_METRICS}
        reference = best_match(answer, refs)[2] if answer else refs[0]
        # Without an embedder AnswerCorrectness is factuality alone (weights [1, 0]); ragas' default is
        # [0.75, 0.25] with the answer-reference cosine.
        embeddings = pieces.Embeddings(self.embed) if self.embed is not None else None
        weights = [0.75, 0.25] if embeddings is not None else [1.0, 0.0]
        async with pieces.AsyncOpenAI(base_url=config.base_url, api_key=config.api_key or "unused",
                                      timeout=self.llm_timeout_s, max_retries=0) as client:
            # Built as rag_service.scoring.ragas_scores builds it: JSON mode through instructor, which
            # re-asks ``retries`` times when a reply does not fit the metric's output model.
            llm = pieces.llm_factory(config.model, client=client, max_tokens=config.max_tokens,
                                     max_retries=config.retries)
            c = ragas.collections
            makers: dict[str, Callable[[], Awaitable[Any]]] = {
                "ragas_llm_context_recall": lambda: c.ContextRecall(llm=llm).ascore(
                    user_input=question, retrieved_contexts=retrieved, reference=reference),
                "ragas_llm_context_precision": lambda: c.ContextPrecisionWithReference(llm=llm).ascore(
                    user_input=question, reference=reference, retrieved_contexts=retrieved),
                "ragas_llm_answer_correctness": lambda: c.AnswerCorrectness(
                    llm=llm, embeddings=embeddings, weights=weights).ascore(
                    user_input=question, response=answer, reference=reference),
            }
            fixed: dict[str, Scored] = {}
            if not retrieved:  # as offline: nothing retrieved recalls nothing (and ragas refuses to judge it)
                fixed.update({name: (0.0, SCORERS[name]) for name in RAGAS_LLM_METRICS[:2]})
            if not answer:
                fixed["ragas_llm_answer_correctness"] = _skipped(SCORERS["ragas_llm_answer_correctness"], "no answer")
            jobs = {name: make for name, make in makers.items() if name not in fixed}
            values = await asyncio.gather(*(_attempt(SCORERS[name], make) for name, make in jobs.items()))
        return {**fixed, **dict(zip(jobs, values, strict=True))}


async def _contexts(ragas: SimpleNamespace, retrieved: list[str], expected: list[str]) -> dict[str, Scored]:
    """A retrieved context counts as relevant when its Levenshtein similarity to some reference context
    reaches ragas' threshold (0.5): precision is the average precision of those verdicts over the ranking,
    recall the share of reference contexts that some retrieved context matches."""
    names = ("ragas_context_precision", "ragas_context_recall")
    if not expected:
        return {name: _skipped(SCORERS[name], "no reference contexts") for name in names}
    if not retrieved:  # ragas' recall crashes on max([]); nothing retrieved finds nothing
        return {name: (0.0, SCORERS[name]) for name in names}
    sample = ragas.Sample(retrieved_contexts=retrieved, reference_contexts=expected)
    classes = (ragas.PrecisionNonLLM, ragas.RecallNonLLM)
    return {name: await _attempt(SCORERS[name], lambda cls=cls: cls().single_turn_ascore(sample))
            for name, cls in zip(names, classes, strict=True)}
