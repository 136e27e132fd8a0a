"""ragas Faithfulness and answer relevancy against the local fake OpenAI server."""

from __future__ import annotations

import asyncio
import json
import os

import numpy as np
import pytest

from rag_service.config import load_settings
from rag_service.scoring import ragas_scores as ragas_module
from rag_service.scoring.ragas_scores import RagasConfig, ragas_scores
from tests.fake_openai import FakeOpenAI, Reply
from tests.scoring.llm_fakes import (
    BRONCOS,
    GENERATED,
    PANTHERS,
    QUESTION,
    QUESTION_PROMPT,
    STATEMENTS_PROMPT,
    VERDICTS_PROMPT,
    bag_of_words,
    config_for,
    embed,
    queue_ragas,
    scoring_input,
)


async def test_ragas_faithfulness_and_response_relevancy_against_the_endpoint(server: FakeOpenAI) -> None:
    queue_ragas(server, verdicts=(1, 0))
    result = await ragas_scores(scoring_input(), config_for(server.url), embed=embed, budget_s=10)
    requests = [r["body"] for r in server.requests]
    assert result.notes == []
    scores = {s.metric: s for s in result.scores}
    assert scores["faithfulness"].value == 0.5 and scores["faithfulness"].scorer == "ragas:Faithfulness"
    assert "50% of the answer's statements" in scores["faithfulness"].reason
    expected = float(np.mean([bag_of_words(q) @ bag_of_words(QUESTION) for q in GENERATED]))
    assert 0 < expected < 1
    assert scores["relevance"].value == pytest.approx(expected)
    assert scores["relevance"].scorer == "ragas:ResponseRelevancy"
    # 2 Faithfulness calls + 3 generated questions, all JSON mode on the configured model.
    assert len(requests) == 5
    assert {r["model"] for r in requests} == {"ragas-model"}
    assert all(r["response_format"] == {"type": "json_object"} for r in requests)
    prompts = [r["messages"][-1]["content"] for r in requests]
    assert sum(QUESTION_PROMPT in p for p in prompts) == 3
    # Citation markers are stripped before ragas reads the answer; the contexts are joined.
    statements_prompt = next(p for p in prompts if STATEMENTS_PROMPT in p)
    assert '"answer": "Kawann Short led the Panthers in sacks with 11."' in statements_prompt
    verdicts_prompt = next(p for p in prompts if VERDICTS_PROMPT in p)
    assert PANTHERS in verdicts_prompt and BRONCOS in verdicts_prompt


async def test_a_noncommittal_answer_has_no_ragas_relevance(server: FakeOpenAI) -> None:
    queue_ragas(server, verdicts=(1, 1), noncommittal=1)
    result = await ragas_scores(scoring_input(), config_for(server.url), embed=embed, budget_s=10)
    scores = {s.metric: s for s in result.scores}
    assert scores["relevance"].value == 0 and "noncommittal" in scores["relevance"].reason
    assert scores["faithfulness"].value == 1


async def test_a_ragas_metric_that_fails_is_a_note_and_the_other_still_scores(server: FakeOpenAI) -> None:
    queue_ragas(server)
    server.routes.insert(0, (STATEMENTS_PROMPT, [Reply("I cannot do that.")]))
    result = await ragas_scores(scoring_input(), config_for(server.url), embed=embed, budget_s=10)
    statement_calls = sum(STATEMENTS_PROMPT in json.dumps(r["body"]["messages"]) for r in server.requests)
    assert [s.metric for s in result.scores] == ["relevance"]
    assert len(result.notes) == 1 and result.notes[0].startswith("ragas Faithfulness failed: ")
    assert statement_calls == 2  # instructor re-asked once (RagasConfig.retries) before giving up


async def test_ragas_times_out_within_the_budget(server: FakeOpenAI) -> None:
    server.default = Reply("{}", delay_s=3)
    loop_time = asyncio.get_running_loop().time
    await ragas_module.load_ragas()  # the import is not what this test times
    started = loop_time()
    result = await ragas_scores(scoring_input(), config_for(server.url), embed=embed, budget_s=0.5)
    elapsed = loop_time() - started
    assert result.scores == []
    assert sorted(result.notes) == ["ragas Faithfulness timed out after 0.5 s",
                                    "ragas ResponseRelevancy timed out after 0.5 s"]
    assert elapsed < 2


async def test_ragas_skips_what_it_cannot_score(server: FakeOpenAI) -> None:
    queue_ragas(server)
    result = await ragas_scores(scoring_input(contexts=[]), config_for(server.url), embed=None, budget_s=5)
    assert server.requests == []
    assert result.scores == []
    assert result.notes == ["ragas Faithfulness skipped: no contexts to check the answer against",
                            "ragas ResponseRelevancy skipped: no embedder was given"]


async def test_without_ragas_installed_nothing_is_scored_and_a_note_says_why(monkeypatch: pytest.MonkeyPatch,
                                                                              server: FakeOpenAI) -> None:
    def missing() -> None:
        raise ImportError("No module named 'ragas'")

    monkeypatch.setattr(ragas_module, "_load", missing)
    result = await ragas_scores(scoring_input(), config_for(server.url), embed=embed, budget_s=5)
    assert server.requests == []
    assert result.scores == []
    assert len(result.notes) == 1 and result.notes[0].startswith("ragas is not installed (pip install")


def test_loading_ragas_turns_tracking_off_unless_the_user_chose(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGAS_DO_NOT_TRACK", "false")
    ragas_module._load.cache_clear()
    try:
        ragas_module._load()
        assert os.environ["RAGAS_DO_NOT_TRACK"] == "false"
        monkeypatch.delenv("RAGAS_DO_NOT_TRACK")
        ragas_module._load.cache_clear()
        ragas_module._load()
        assert os.environ["RAGAS_DO_NOT_TRACK"] == "true"
    finally:
        ragas_module._load.cache_clear()


def test_ragas_config_from_settings() -> None:
    assert RagasConfig.from_settings(load_settings()) is None
    assert RagasConfig.from_settings(load_settings(llm_base_url="http://llm/v1", eval_ragas=False)) is None
    config = RagasConfig.from_settings(load_settings(llm_base_url="http://llm/v1", llm_model_simple="m",
                                                     llm_api_key="k"))
    assert config == RagasConfig(base_url="http://llm/v1", model="m", api_key="k")
    with pytest.raises(ValueError, match="strictness"):
        RagasConfig(base_url="http://llm/v1", model="m", strictness=0)


