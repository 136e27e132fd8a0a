"""The eval runner end to end against the real PostgreSQL and the real local model: a small BEIR
corpus in retrieval mode, real XQuAD questions in full mode, paired comparisons of stored runs (a
planted difference found, identical configurations not), and the promotion gate on real runs."""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import text

from evaluation.comparisons import compare_runs
from evaluation.datasets import load_beir, load_qa
from evaluation.preparation import default_collection
from evaluation.promotion import EvalPromotionGate
from evaluation.summary import run_scores
from rag_service.config import load_settings
from rag_service.domain import Caller, EvalRunRequest
from rag_service.domain.prompts import NewVersionRequest
from rag_service.errors import ConflictError, InvalidInputError
from rag_service.runtime import Runtime
from tests.conftest import SHARED_DATA

ADMIN = Caller(role="admin")
XQUAD = SHARED_DATA / "xquad_en" / "xquad_en_flat.jsonl"

DOCUMENTS = {
    "d1": ("Photosynthesis", "Plants turn sunlight, water and carbon dioxide into glucose and oxygen in chloroplasts."),
    "d2": ("Volcanoes", "Magma rises through the crust and erupts as lava, ash and volcanic gases."),
    "d3": ("Jazz", "Jazz began in New Orleans, mixing blues, ragtime and brass band marches with improvisation."),
    "d4": ("Tides", "The gravitational pull of the moon and the sun raises the ocean tides twice a day."),
    "d5": ("Vaccines", "A vaccine trains the immune system to recognise a pathogen without causing the disease."),
    "d6": ("Glaciers", "Glaciers are slow rivers of ice that carve valleys as they move downhill."),
    "d7": ("Chess", "In chess each player starts with sixteen pieces; checkmate of the king ends the game."),
    "d8": ("Bread", "Yeast ferments the sugars in dough, producing carbon dioxide that makes bread rise."),
    "d9": ("Comets", "Comets are icy bodies whose tails point away from the sun as solar wind pushes them."),
    "d10": ("Bees", "Honey bees communicate the direction of flowers to their hive with a waggle dance."),
}
QUERIES = {
    "q1": ("How do plants make glucose from sunlight?", "d1"),
    "q2": ("What comes out of a volcano when it erupts?", "d2"),
    "q3": ("Where did jazz music begin?", "d3"),
    "q4": ("Why does the ocean have tides?", "d4"),
    "q5": ("How does bread dough rise?", "d8"),
    "q6": ("How do bees tell the hive where flowers are?", "d10"),
}


def beir_dir(root: Path) -> Path:
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps({"_id": d, "title": t, "text": x}) + "\n"
                                               for d, (t, x) in DOCUMENTS.items()))
    (root / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": t}) + "\n"
                                                for q, (t, _) in QUERIES.items()))
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"{q}\t{d}\t1\n" for q, (_, d) in QUERIES.items()))
    return root


def xquad_subset(root: Path, lines: int) -> Path:
    """The first questions of XQuAD (en): real questions, real reference answers and passages."""
    path = root / "xquad_subset.jsonl"
    path.write_text("".join(XQUAD.read_text().splitlines(keepends=True)[:lines]))
    return path


@pytest.fixture(scope="module")
async def runtime(migrated_url: str, local_embedder) -> AsyncIterator[Runtime]:  # noqa: ANN001
    rt = Runtime.open(load_settings(database_url=migrated_url))
    rt.embedder = local_embedder  # the session's already-loaded model
    yield rt
    await rt.close()


async def _run(rt: Runtime, **fields: object):  # noqa: ANN202
    run = await rt.eval_runner.create(EvalRunRequest(**fields))
    seen: list[tuple[str, int, int]] = []
    finished = await rt.eval_runner.execute(run.id, lambda stage, done, total: seen.append((stage, done, total)))
    return finished, await rt.eval_runs.results(run.id), seen


async def _chunk_ids(rt: Runtime, collection: str) -> list[str]:
    async with rt.db.connect() as conn:
        rows = (await conn.execute(text(
            "SELECT c.id FROM chunks c JOIN documents d ON d.id = c.document_id JOIN collections k "
            "ON k.id = d.collection_id WHERE k.name = :name ORDER BY c.id"), {"name": collection})).all()
    return [str(r.id) for r in rows]


async def test_a_beir_retrieval_run_stores_every_item_with_ranx_metrics_and_reproduces(
        runtime: Runtime, tmp_path: Path) -> None:
    spec = f"beir:{beir_dir(tmp_path / 'beir')}"
    first, results, seen = await _run(runtime, dataset=spec, name="beir-a")
    assert (first.status, first.items_total, first.items_done, first.items_failed) == ("finished", 6, 6, 0)
    assert first.collection == default_collection(load_beir(tmp_path / "beir"))
    assert ("items", 6, 6) in seen and any(stage == "ingest" for stage, _, _ in seen)
    assert [r.item_id for r in results] == list(QUERIES)
    for result in results:
        assert set(result.metrics) >= {"ndcg@10", "recall@10", "recall@100", "mrr@10"}
        assert result.scorers["ndcg@10"] == "ranx" and result.retrieved[0].rank == 1
        assert result.relevant_rank is not None and result.latency_ms["total"] > 0
    # Distinct topics: the real retriever puts the one relevant document first nearly always.
    assert first.summary["metrics"]["ndcg@10"]["mean"] >= 0.8
    assert first.config["prompts"] == {} and first.config_hash  # retrieval reads no prompt
    chunks = await _chunk_ids(runtime, first.collection)
    assert len(set(chunks)) >= len(DOCUMENTS)
    # What a comparison loads (the numbers only, picked out in PostgreSQL) scores as the whole results do.
    assert run_scores(await runtime.eval_runs.scores(first.id)) == run_scores(results)

    second, again, _ = await _run(runtime, dataset=spec, name="beir-b")
    assert second.config_hash == first.config_hash and second.collection == first.collection
    assert await _chunk_ids(runtime, first.collection) == chunks  # same data: nothing re-ingested
    ir = ("ndcg@10", "recall@10", "recall@100", "mrr@10")
    assert [{m: r.metrics[m] for m in ir} for r in again] == [{m: r.metrics[m] for m in ir} for r in results]
    assert [[d.id for d in r.retrieved] for r in again] == [[d.id for d in r.retrieved] for r in results]


async def test_a_finished_run_is_not_run_again_and_bad_requests_say_what_to_fix(
        runtime: Runtime, tmp_path: Path) -> None:
    finished = await runtime.eval_runs.find("beir-a")
    with pytest.raises(ConflictError, match="has finished"):
        await runtime.eval_runner.execute(finished.id)
    # A finished run with failed items resumes for those items only.
    async with runtime.db.begin() as conn:
        await conn.execute(text(
            "UPDATE eval_results SET failed = true, result = result || '{\"error\": \"planted\"}'::jsonb "
            "WHERE run_id = :id AND item_id IN ('q2', 'q5')"), {"id": finished.id})
    assert (await runtime.eval_runs.get(finished.id)).items_failed == 2

    async def finished_at() -> dict[str, object]:
        async with runtime.db.connect() as conn:
            return dict((await conn.execute(text("SELECT item_id, finished_at FROM eval_results WHERE run_id = :id"),
                                            {"id": finished.id})).all())

    before = await finished_at()
    with pytest.raises(ConflictError, match="2 failed items; resume it"):  # a queue job's retry leaves it
        await runtime.eval_runner.execute(finished.id)
    resumed = await runtime.eval_runner.execute(finished.id, redo_failed=True)  # `ragsvc eval resume`
    assert (resumed.status, resumed.items_done, resumed.items_failed) == ("finished", 6, 0)
    after = await finished_at()
    assert sorted(item for item in after if after[item] != before[item]) == ["q2", "q5"]
    with pytest.raises(InvalidInputError, match="not used in retrieval mode"):
        await runtime.eval_runner.create(EvalRunRequest(dataset=f"beir:{beir_dir(tmp_path / 'b')}",
                                                        prompts={"answer_extractive": 1}))
    with pytest.raises(InvalidInputError, match="prompts"):
        await runtime.eval_runner.create(EvalRunRequest(dataset=f"qa:{XQUAD}", mode="full",
                                                        prompts={"answer_extractive": 99}))


async def test_a_full_run_grades_answers_with_every_metric_and_stores_nothing_user_facing(
        runtime: Runtime, tmp_path: Path) -> None:
    spec = f"qa:{xquad_subset(tmp_path, 40)}"
    run, results, _ = await _run(runtime, dataset=spec, mode="full", limit=12, concurrency=3, name="xquad-full")
    assert (run.status, run.items_done, run.items_failed) == ("finished", 12, 0)
    answered = [r for r in results if r.outcome == "answered"]
    assert len(answered) >= 8
    for result in answered:
        assert set(result.metrics) >= {"faithfulness", "relevance", "correctness", "coverage", "consistency",
                                       "freshness", "traceability", "overall", "squad_f1", "squad_exact_match",
                                       "correctness_vs_reference", "ragas_rouge_l", "ragas_bleu",
                                       "ragas_semantic_similarity", "ragas_context_precision", "ragas_context_recall",
                                       "ndcg@10"}
        assert result.scorers["ragas_rouge_l"].startswith("ragas") and result.answer
        assert {"retrieve-1", "generate", "total"} <= set(result.latency_ms)
        assert result.cost_usd == 0.0  # extractive: no LLM tokens
    # Extractive answers hold the reference span in a sentence: some match it closely, none is empty.
    assert run.summary["metrics"]["squad_f1"]["mean"] > 0.05 and max(r.metrics["squad_f1"] for r in answered) >= 0.5
    assert run.config["generator"] == "extractive" and run.config["prompts"]["answer_extractive"] == 1
    async with runtime.db.connect() as conn:
        for table in ("queries", "answers", "answer_scores", "review_items", "conversation_turns"):
            assert (await conn.execute(text(f"SELECT count(*) FROM {table}"))).scalar_one() == 0, table


async def test_compare_finds_a_planted_difference_and_none_between_identical_configurations(
        runtime: Runtime, migrated_url: str, local_embedder, tmp_path: Path) -> None:  # noqa: ANN001
    spec = f"qa:{xquad_subset(tmp_path, 60)}"
    await _run(runtime, dataset=spec, name="xq-default-1")
    await _run(runtime, dataset=spec, name="xq-default-2")
    weak = Runtime.open(load_settings(database_url=migrated_url, retrieval_strategies="pattern"))
    weak.embedder = local_embedder
    try:
        planted, _, _ = await _run(weak, dataset=spec, name="xq-pattern-only")
    finally:
        await weak.close()
    assert planted.config_hash != (await runtime.eval_runs.find("xq-default-1")).config_hash

    worse = (await compare_runs(runtime.eval_runs, "xq-default-1", "xq-pattern-only")).comparison
    ndcg = worse.metric("ndcg@10")
    assert ndcg.direction == "worse" and ndcg.significant and ndcg.ci_high < 0 and ndcg.n == 60
    assert worse.worst_items and worse.worst_items[0].regression > 0

    same = (await compare_runs(runtime.eval_runs, "xq-default-1", "xq-default-2")).comparison
    quality = [m for m in same.metrics if m.metric != "latency_ms"]
    assert quality and all(not m.significant and m.difference == 0 for m in quality)


async def test_the_promotion_gate_refuses_a_regressing_candidate_naming_metric_delta_and_ci(
        runtime: Runtime, tmp_path: Path) -> None:
    spec = f"qa:{xquad_subset(tmp_path, 40)}"
    name = "answer_extractive"
    # A candidate that abstains on nearly everything: answers vanish, every answer metric drops.
    timid = await runtime.prompts.create(ADMIN, "prompt", name, NewVersionRequest(
        parameters={"abstain_below": 0.99}, note="abstains", label="candidate"))
    same = await runtime.prompts.create(ADMIN, "prompt", name, NewVersionRequest(note="same as production"))
    await _run(runtime, dataset=spec, mode="full", limit=30, name="gate-production")
    await _run(runtime, dataset=spec, mode="full", limit=30, name="gate-timid", prompts={name: timid.version})
    await _run(runtime, dataset=spec, mode="full", limit=30, name="gate-same", prompts={name: same.version})

    with pytest.raises(ConflictError) as refused:
        await runtime.prompts.move_label(ADMIN, "prompt", name, "production", timid.version, "try",
                                         eval_run="gate-timid")
    message = str(refused.value)
    assert "offline gate refuses" in message and "95% CI" in message and "squad_f1" in message
    assert (await runtime.prompt_repository.labels("prompt", name))["production"] == 1

    with pytest.raises(ConflictError, match="not version"):  # the run must be of the version promoted
        await runtime.prompts.move_label(ADMIN, "prompt", name, "production", same.version, None,
                                         eval_run="gate-timid")
    move = await runtime.prompts.move_label(ADMIN, "prompt", name, "production", same.version, "no change",
                                            eval_run="gate-same")
    assert move.to_version == same.version and "offline gate" in (move.reason or "")

    strict = EvalPromotionGate(runtime.eval_runs, runtime.prompt_repository, required=True, tolerance=0.02,
                               tolerances={}, answer_prompt="answer_extractive")
    gate_before = runtime.prompts.offline_gate
    with pytest.raises(ConflictError, match="needs an eval run"):
        await strict.check("prompt", name, timid.version, None)
    runtime.prompts.offline_gate = strict  # the other ways to production close while the gate is required
    with pytest.raises(ConflictError, match="cannot become production directly"):
        await runtime.prompts.create(ADMIN, "prompt", name, NewVersionRequest(note="skip", label="production"))
    with pytest.raises(ConflictError, match="RAGSVC_PROMOTION_REQUIRES_EVAL_RUN"):
        runtime.prompts.refuse_ungated_production("guidelines", "guidelines", "new guidelines")  # PUT
    # A prompt no eval run can exercise (the judge's, here) is not gated: it moves without a run.
    assert await strict.check("prompt", "judge_cot", 1, None) is None
    with pytest.raises(ConflictError, match="no eval run exercises prompt 'judge_cot'"):
        await strict.check("prompt", "judge_cot", 1, "gate-same")
    runtime.prompts.offline_gate = gate_before

    # A candidate whose items fail must not pass on the fewer items left to compare.
    production = await runtime.eval_runs.find("gate-production")
    broken_config = json.loads(json.dumps(production.config))
    broken_config["prompts"][name] = same.version + 1
    broken = await runtime.prompts.create(ADMIN, "prompt", name, NewVersionRequest(note="breaks answers"))
    assert broken.version == same.version + 1
    await runtime.prompts.move_label(ADMIN, "prompt", name, "production", 1, "back", eval_run="gate-production")
    record = await runtime.eval_runs.create(
        name="gate-broken", dataset=production.dataset, request=production.request.model_copy(
            update={"name": "gate-broken", "prompts": {name: broken.version}}),
        collection=production.collection, config=broken_config, config_hash="broken", code_version=None,
        items_total=production.items_total)
    for position, result in enumerate(await runtime.eval_runs.results(production.id)):
        await runtime.eval_runs.record(record.id, position, result if position % 3 else result.model_copy(
            update={"error": "GenerationError: the template failed", "metrics": {}}))
    await runtime.eval_runs.finish(record.id, summary={})
    with pytest.raises(ConflictError, match=r"10 items failed in eval run .* against 0"):
        await strict.check("prompt", name, broken.version, "gate-broken")


async def test_the_gate_wants_a_full_run(runtime: Runtime, tmp_path: Path) -> None:
    await _run(runtime, dataset=f"beir:{beir_dir(tmp_path / 'beir')}", name="retrieval-only")
    gate = EvalPromotionGate(runtime.eval_runs, runtime.prompt_repository, required=False, tolerance=0.02,
                             tolerances={}, answer_prompt="answer_extractive")
    with pytest.raises(ConflictError, match=r"retrieval only.*--mode full"):
        await gate.check("prompt", "answer_extractive", 1, "retrieval-only")


async def test_a_queued_run_answers_with_the_versions_it_recorded_and_only_effective_pins(
        runtime: Runtime, tmp_path: Path) -> None:
    spec = f"qa:{xquad_subset(tmp_path, 20)}"
    name = "answer_extractive"
    production = (await runtime.prompt_repository.labels("prompt", name))["production"]
    queued = await runtime.eval_runner.create(EvalRunRequest(dataset=spec, mode="full", limit=8, name="queued"))
    assert queued.config["prompts"][name] == production and "guidelines" in queued.config["prompts"]
    # Production moves to a version that abstains on everything before a worker picks the run up.
    timid = await runtime.prompts.create(ADMIN, "prompt", name, NewVersionRequest(
        parameters={"abstain_below": 1.0}, note="abstains", label="production"))
    run = await runtime.eval_runner.execute(queued.id)
    results = await runtime.eval_runs.results(run.id)
    assert sum(r.outcome == "answered" for r in results) >= 5, [r.outcome for r in results]
    later = await runtime.eval_runner.create(EvalRunRequest(dataset=spec, mode="full", limit=8))
    assert later.config["prompts"][name] == timid.version and later.config_hash != run.config_hash

    with pytest.raises(InvalidInputError, match=r"\['judge_cot'\] cannot be pinned"):
        await runtime.eval_runner.create(EvalRunRequest(dataset=spec, mode="full", prompts={"judge_cot": 1}))
    with pytest.raises(InvalidInputError, match="not used in retrieval mode"):
        await runtime.eval_runner.create(EvalRunRequest(dataset=spec, prompts={"guidelines": 1}))


async def test_an_item_whose_metrics_fail_is_recorded_failed_and_the_run_goes_on(
        runtime: Runtime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = f"qa:{xquad_subset(tmp_path, 20)}"
    import evaluation.items

    squad = evaluation.items.squad_scores
    first_references = list(load_qa(XQUAD).items[0].answers)

    def breaks_on_one(prediction: str, references: list[str]) -> dict[str, float | None]:
        if list(references) == first_references:
            raise ValueError("metric blew up")
        return squad(prediction, references)

    monkeypatch.setattr(evaluation.items, "squad_scores", breaks_on_one)
    run, results, _ = await _run(runtime, dataset=spec, mode="full", limit=4, name="one-item-breaks")
    assert (run.status, run.items_done, run.items_failed) == ("finished", 4, 1)
    assert [r.error for r in results if r.error] == ["ValueError: metric blew up"]


async def test_ranx_is_warmed_in_a_worker_thread_before_the_items_run(
        runtime: Runtime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # ranx's first use loads numba code for seconds; inside the first item it blocked the event loop
    # and the other items' reranker timeouts fired (a fresh run's nDCG once differed from a resumed one's).
    import evaluation.items
    import evaluation.runner

    events: list[tuple[str, int]] = []
    warm, score = evaluation.runner.warm_up_ir_metrics, evaluation.items.ir_metrics

    def recorded_warm_up() -> None:
        events.append(("warm-up", threading.get_ident()))
        warm()

    def recorded_ir_metrics(*args: object) -> dict[str, dict[str, float]]:
        events.append(("item", threading.get_ident()))
        return score(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(evaluation.runner, "warm_up_ir_metrics", recorded_warm_up)
    monkeypatch.setattr(evaluation.items, "ir_metrics", recorded_ir_metrics)
    run, _, _ = await _run(runtime, dataset=f"beir:{beir_dir(tmp_path / 'beir')}", name="warmed")
    assert run.items_done == len(QUERIES)
    loop_thread = threading.get_ident()
    assert events[0][0] == "warm-up" and events[0][1] != loop_thread
    assert events[1:] == [("item", loop_thread)] * len(QUERIES)


async def test_a_run_that_cannot_be_queued_says_so(runtime: Runtime, migrated_url: str, tmp_path: Path) -> None:
    from evaluation.jobs import enqueue_run
    from ingestion.jobs import make_queue

    run = await runtime.eval_runner.create(EvalRunRequest(dataset=f"beir:{beir_dir(tmp_path / 'beir')}"))
    with pytest.raises(Exception):  # noqa: B017, PT011 - procrastinate's own "app not open" error
        await enqueue_run(make_queue(migrated_url), run.id, runtime.eval_runs)  # never opened
    failed = await runtime.eval_runs.get(run.id)
    assert failed.status == "failed" and failed.error.startswith("could not be queued")
