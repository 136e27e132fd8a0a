"""Offline evaluation runs over HTTP: queue a run for the workers, follow it, read its item results,
compare two runs and get a run's report. Starting a run needs the admin role (it reads dataset files
on the server's disk); reading needs reviewer."""

import asyncio
import uuid
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel

from evaluation.comparisons import compare_runs
from evaluation.jobs import enqueue_run
from rag_service.api.auth import AdminDep, ReviewerDep, role, scoped_collection
from rag_service.api.deps import RuntimeDep
from rag_service.domain import DEFAULT_TENANT, EvalItemResult, EvalRun, EvalRunRequest
from rag_service.errors import ForbiddenError

router = APIRouter(prefix="/v1/eval-runs", tags=["eval runs"])
_NOT_FOUND = {404: {"description": "No such run"}}


class EvalRunsPage(BaseModel):
    data: list[EvalRun]
    count: int


class EvalResultsPage(BaseModel):
    data: list[EvalItemResult]
    count: int


@router.post("", status_code=202, response_model=EvalRun, summary="Queue an offline evaluation run",
             description="Loads and checks the dataset (its content hash becomes the run's dataset version), snapshots "
                         "the configuration, stores the run and queues it; a worker executes it (`ragsvc worker`, or "
                         "the one in `ragsvc serve`). Poll the `Location`. A malformed dataset is a 422 naming the "
                         "file, line and field.",
             responses={422: {"description": "Bad request or malformed dataset"}}, **role("admin"))
async def create_run(body: EvalRunRequest, request: Request, runtime: RuntimeDep, caller: AdminDep) -> JSONResponse:
    if caller.tenant != DEFAULT_TENANT and body.dataset != "golden":
        # beir:DIR and qa:FILE read the server's disk and ingest what they read into the caller's collection.
        raise ForbiddenError(f"only keys of the {DEFAULT_TENANT!r} tenant (the operator's) run datasets from the "
                             "server's disk; other tenants run `golden` (their own reviewed answers)")
    if body.collection is not None:
        scoped_collection(caller, body.collection)
    elif caller.collections is not None:
        raise ForbiddenError(f"this key may only use the collections {', '.join(caller.collections)}; name one "
                             "as `collection`")
    run = await runtime.eval_runner.create(body, created_by=caller.label, tenant=caller.tenant)
    await enqueue_run(request.app.state.queue, run.id, runtime.eval_runs)
    return JSONResponse(run.model_dump(mode="json"), status_code=202, headers={"Location": f"/v1/eval-runs/{run.id}"})


@router.get("", response_model=EvalRunsPage, summary="Runs, newest first", **role("reviewer"))
async def list_runs(runtime: RuntimeDep, caller: ReviewerDep, limit: Annotated[int, Query(ge=1, le=200)] = 50,
                    offset: Annotated[int, Query(ge=0)] = 0) -> EvalRunsPage:
    runs, total = await runtime.eval_runs.list(limit=limit, offset=offset, scope=caller.scope)
    return EvalRunsPage(data=runs, count=total)


@router.get("/{run_id}", response_model=EvalRun, summary="A run: status, progress, configuration and summary",
            responses=_NOT_FOUND, **role("reviewer"))
async def get_run(run_id: uuid.UUID, runtime: RuntimeDep, caller: ReviewerDep) -> EvalRun:
    return await runtime.eval_runs.get(run_id, caller.scope)


@router.get("/{run_id}/results", response_model=EvalResultsPage, summary="A run's item results, in dataset order",
            responses=_NOT_FOUND, **role("reviewer"))
async def get_results(run_id: uuid.UUID, runtime: RuntimeDep, caller: ReviewerDep,
                      limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                      offset: Annotated[int, Query(ge=0)] = 0) -> EvalResultsPage:
    run = await runtime.eval_runs.get(run_id, caller.scope)
    return EvalResultsPage(data=await runtime.eval_runs.results(run_id, limit=limit, offset=offset),
                           count=run.items_done)


@router.get("/{run_id}/compare", summary="This run (B) against another (A), paired by item",
            description="Per metric: mean difference B - A with a paired bootstrap 95% CI, a paired randomisation "
                        "p-value and Holm's correction across metrics; the items that got worse most. Runs on "
                        "different dataset versions are refused (409) unless `allow_different_datasets`.",
            responses={**_NOT_FOUND, 409: {"description": "Different dataset versions"}}, **role("reviewer"))
async def compare(run_id: uuid.UUID, runtime: RuntimeDep, caller: ReviewerDep,
                  against: Annotated[str, Query(description="The baseline run, by id or name.")],
                  allow_different_datasets: bool = False,
                  worst: Annotated[int, Query(ge=0, le=100)] = 10) -> dict[str, Any]:
    found = await compare_runs(runtime.eval_runs, against, str(run_id), worst=worst,
                               allow_different_datasets=allow_different_datasets, scope=caller.scope)
    return {"run_a": str(found.run_a.id), "run_b": str(found.run_b.id), "seconds": round(found.seconds, 3),
            **found.comparison.model_dump(mode="json")}


@router.get("/{run_id}/report", response_class=HTMLResponse, summary="The run's report (self-contained HTML)",
            responses=_NOT_FOUND, **role("reviewer"))
async def report(run_id: uuid.UUID, runtime: RuntimeDep, caller: ReviewerDep,
                 against: Annotated[str | None, Query(description="A baseline run to compare with.")] = None,
                 format: Annotated[Literal["html"], Query()] = "html") -> HTMLResponse:
    from evaluation.reports import render_html  # matplotlib: the eval extra, loaded when a report is asked for

    if against is not None:
        found = await compare_runs(runtime.eval_runs, against, str(run_id), with_results=True, scope=caller.scope)
        # Drawing the plots is CPU work: off the event loop.
        page = await asyncio.to_thread(render_html, found.run_b, found.results_b, against=found.run_a,
                                       against_results=found.results_a, comparison=found.comparison)
    else:
        run = await runtime.eval_runs.get(run_id, caller.scope)
        page = await asyncio.to_thread(render_html, run, await runtime.eval_runs.results(run_id))
    return HTMLResponse(page)
