"""POST /v1/evaluate: grade an answer produced elsewhere with the service's own scorers."""

from __future__ import annotations

from fastapi import APIRouter

from rag_service.api.auth import ReaderDep, role
from rag_service.api.deps import RuntimeDep
from rag_service.domain import EvaluateRequest, EvaluationReport
from rag_service.pipeline.evaluation import evaluate_answer

router = APIRouter(prefix="/v1", tags=["evaluation"])


@router.post(
    "/evaluate",
    response_model=EvaluationReport,
    summary="Grade an answer on the seven metrics",
    description="Takes a question, an answer (its `[n]` markers cite `contexts` by position, 1-based), the contexts "
                "(strings, or `{\"text\", \"effective_date\"}`) and optionally a reference answer; returns the same "
                "grades `/v1/query` attaches to its answers, from the same scorers (`local-v1`; with an LLM "
                "configured, the LLM judge and ragas too). `needs_review` and `reasons` say what the review gate "
                "would do with it; nothing is stored or queued.",
    responses={422: {"description": "Malformed request (the body says which field and why)"}},
    **role("reader"),
)
async def evaluate(body: EvaluateRequest, runtime: RuntimeDep, _: ReaderDep) -> EvaluationReport:
    return await evaluate_answer(runtime.evaluator, runtime.intent_parser, body)
