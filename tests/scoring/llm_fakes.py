"""Shared by the LLM-grading tests: the fixture answer, fake judge replies, and ragas' prompts
answered by content (ragas sends its prompts concurrently)."""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Sequence

import numpy as np

from rag_service.config import load_settings
from rag_service.domain import EvidenceContext
from rag_service.prompts.registry import PromptRegistry
from rag_service.providers.llm import make_llm
from rag_service.scoring.evidence import ScoringInput
from rag_service.scoring.judge import judge_variables
from rag_service.scoring.ragas_scores import RagasConfig
from tests.fake_openai import FakeOpenAI

PANTHERS = ("The Panthers defense gave up just 308 points, ranking sixth in the league. Pro Bowl defensive tackle "
            "Kawann Short led the team in sacks with 11.")
BRONCOS = "The Broncos won Super Bowl 50 on February 7, 2016, beating the Panthers 24-10."
QUESTION = "Who led the Panthers in sacks?"
ANSWER = "Kawann Short led the Panthers in sacks with 11 [1]."

# What each prompt says, to answer it by content (ragas sends its prompts concurrently).
JUDGE_PROMPT = "You grade one answer"
STATEMENTS_PROMPT = "Break down each sentence into one or more fully understandable statements"
VERDICTS_PROMPT = "judge the faithfulness of a series of statements"
QUESTION_PROMPT = "Generate a question for the given answer"


def scoring_input(**changes: object) -> ScoringInput:
    fields: dict[str, object] = {"question": QUESTION, "answer": ANSWER,
                                 "contexts": [EvidenceContext(text=PANTHERS, title="Panthers"),
                                              EvidenceContext(text=BRONCOS, title="Broncos")]}
    return ScoringInput(**{**fields, **changes})  # type: ignore[arg-type]


def judge_reply(**overrides: object) -> str:
    scores: dict[str, object] = {
        "faithfulness": {"value": 0.9, "reason": "The one claim is stated in passage 1."},
        "relevance": {"value": 1.0, "reason": "It names the sack leader."},
        "correctness": {"value": 0.8, "reason": "The number matches passage 1."},
        "coverage": {"value": 0.7, "reason": "It answers the question."},
        "consistency": {"value": 1, "reason": "Nothing contradicts."},
    }
    scores.update(overrides)
    return json.dumps({"reasoning_steps": ["Claim 1 cites passage 1, which states it."],
                       "scores": {k: v for k, v in scores.items() if v is not None}})


def llm_for(url: str):  # noqa: ANN201
    return make_llm(load_settings(llm_base_url=url, llm_model_simple="judge-model", llm_timeout_s=5))


def judge_messages(inp: ScoringInput) -> list[dict[str, str]]:
    return PromptRegistry().get("judge_cot").render(**judge_variables(inp))



def bag_of_words(text: str) -> np.ndarray:
    vector = np.zeros(64)
    for word in re.findall(r"\w+", text.lower()):
        vector[zlib.crc32(word.encode()) % 64] += 1
    return vector / (np.linalg.norm(vector) or 1)


async def embed(texts: Sequence[str]) -> np.ndarray:
    return np.stack([bag_of_words(t) for t in texts])


GENERATED = ["Who led the Panthers in sacks?", "How many sacks did Kawann Short have?",
             "Which Panthers player had 11 sacks?"]


def queue_ragas(server: FakeOpenAI, *, verdicts: Sequence[int] = (1, 0), noncommittal: int = 0) -> None:
    statements = ["Kawann Short led the Panthers in sacks.", "Kawann Short had 12 sacks."]
    server.on(STATEMENTS_PROMPT, json.dumps({"statements": statements}))
    server.on(VERDICTS_PROMPT, json.dumps({"statements": [
        {"statement": s, "reason": "checked against the context", "verdict": v}
        for s, v in zip(statements, verdicts, strict=True)]}))
    server.on(QUESTION_PROMPT, *(json.dumps({"question": q, "noncommittal": noncommittal}) for q in GENERATED))


def config_for(url: str) -> RagasConfig:
    return RagasConfig(base_url=url, model="ragas-model", api_key="sk-test")


