"""Offline eval runs in the console: the list (status, data, headline metrics) and each run's
report, alone or against another run (the same self-contained HTML ``ragsvc eval report`` writes)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse

from rag_service.web.pages import ConsolePage, render
from rag_service.web.sessions import SessionDep, runtime

router = APIRouter(route_class=ConsolePage)
PAGE = 50


@router.get("/eval-runs")
async def eval_runs(request: Request, session: SessionDep, offset: Annotated[int, Query(ge=0)] = 0) -> HTMLResponse:
    runs, count = await runtime(request).eval_runs.list(limit=PAGE, offset=offset, scope=session.caller.scope)
    return render(request, "eval_runs.html", title="Eval runs", runs=runs, count=count,
                  previous=f"/review/eval-runs?offset={max(0, offset - PAGE)}" if offset else None,
                  next=f"/review/eval-runs?offset={offset + PAGE}" if offset + PAGE < count else None)


@router.get("/eval-runs/{run_id}/report")
async def report(request: Request, run_id: uuid.UUID, session: SessionDep,
                 against: Annotated[str | None, Query(max_length=200)] = None) -> HTMLResponse:
    from evaluation.comparisons import compare_runs  # matplotlib (the eval extra): loaded when a report is asked for
    from evaluation.reports import render_html

    runs = runtime(request).eval_runs
    if against:
        found = await compare_runs(runs, against, str(run_id), with_results=True, scope=session.caller.scope)
        page = await asyncio.to_thread(render_html, found.run_b, found.results_b, against=found.run_a,
                                       against_results=found.results_a, comparison=found.comparison)
    else:
        run = await runs.get(run_id, session.caller.scope)
        page = await asyncio.to_thread(render_html, run, await runs.results(run_id))
    return HTMLResponse(page)
