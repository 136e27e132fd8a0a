"""Experiments between two labels of a prompt: the list, starting one, and one experiment's report
with its chart; promoting the candidate and stopping (admins)."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Depends, Form, Query, Request, Response
from fastapi.responses import HTMLResponse
from pydantic import ValidationError

from rag_service.domain.prompts import CANDIDATE, PRODUCTION, ExperimentRequest
from rag_service.errors import RagServiceError
from rag_service.web.charts import Series, histogram_svg
from rag_service.web.pages import ConsolePage, invalid, redirect, render
from rag_service.web.sessions import FormSessionDep, SessionDep, operator_session, require_admin, runtime

router = APIRouter(route_class=ConsolePage, dependencies=[Depends(operator_session)])

Reason = Annotated[str, Form(max_length=2_000)]


async def _list_page(request: Request, *, offset: int = 0, status_code: int = 200, error: str | None = None,
                     form: dict[str, str] | None = None) -> HTMLResponse:
    rt = runtime(request)
    experiments, count = await rt.prompts.experiments.list(limit=50, offset=offset)
    names = [s.name for s in await rt.prompt_repository.summaries("prompt")]
    form = form or {"name": "", "control_label": PRODUCTION, "candidate_label": CANDIDATE, "share": "0.5", "note": ""}
    return render(request, "experiments.html", title="Experiments", status_code=status_code, error=error,
                  experiments=experiments, count=count, offset=offset, names=names, form=form,
                  previous=f"/review/experiments?offset={max(0, offset - 50)}" if offset else None,
                  next=f"/review/experiments?offset={offset + 50}" if offset + 50 < count else None)


@router.get("/experiments")
async def experiments(request: Request, session: SessionDep,
                      offset: Annotated[int, Query(ge=0)] = 0) -> HTMLResponse:
    return await _list_page(request, offset=offset)


@router.post("/experiments")
async def start(request: Request, session: FormSessionDep, name: Annotated[str, Form(max_length=200)] = "",
                control_label: Annotated[str, Form(max_length=40)] = PRODUCTION,
                candidate_label: Annotated[str, Form(max_length=40)] = CANDIDATE,
                share: Annotated[str, Form(max_length=20)] = "0.5",
                note: Annotated[str, Form(max_length=2_000)] = "") -> Response:
    require_admin(session, "start an experiment")
    form = {"name": name, "control_label": control_label, "candidate_label": candidate_label, "share": share,
            "note": note}
    try:
        try:
            body = ExperimentRequest(name=name, control_label=control_label.strip(),
                                     candidate_label=candidate_label.strip(), share=share, note=note.strip() or None)
        except ValidationError as exc:
            raise invalid(exc) from exc
        experiment = await runtime(request).prompts.start_experiment(session.caller, body)
    except RagServiceError as exc:  # the form comes back as typed, with why it was refused
        return await _list_page(request, status_code=exc.status_code, error=exc.message, form=form)
    return redirect(f"/review/experiments/{experiment.id}?started=1")


async def _experiment_page(request: Request, experiment_id: uuid.UUID, *, status_code: int = 200,
                           error: str | None = None, offer_force: bool = False,
                           flash: list[str] | None = None) -> HTMLResponse:
    rt = runtime(request)
    report = await rt.prompts.experiment_report(experiment_id)
    experiment = report.experiment
    labels = await rt.prompt_repository.labels("prompt", experiment.name)
    chart = histogram_svg([Series(f"{v.variant} (v{v.version}, {v.label})", v.overall_histogram)
                           for v in report.variants],
                          title=f"Overall-score distribution per variant, experiment on {experiment.name}")
    return render(request, "experiment.html", title=f"Experiment on {experiment.name}", status_code=status_code,
                  error=error, report=report, experiment=experiment, chart=chart, production=labels.get(PRODUCTION),
                  offer_force=offer_force or report.decision != "candidate_wins", flash=flash or [])


@router.get("/experiments/{experiment_id}")
async def experiment(request: Request, experiment_id: uuid.UUID, session: SessionDep, started: int = 0,
                     promoted: int = 0, stopped: int = 0) -> HTMLResponse:
    flash = [text for flag, text in ((started, "Experiment started."),
                                     (promoted, "The candidate was promoted: production now points at its version."),
                                     (stopped, "Experiment stopped: all traffic is back on the control.")) if flag]
    return await _experiment_page(request, experiment_id, flash=flash)


@router.post("/experiments/{experiment_id}/promote")
async def promote(request: Request, experiment_id: uuid.UUID, session: FormSessionDep, reason: Reason = "",
                  force: Annotated[str, Form(max_length=10)] = "",
                  eval_run: Annotated[str, Form(max_length=200)] = "") -> Response:
    require_admin(session, "promote a candidate")
    try:
        await runtime(request).prompts.promote(session.caller, experiment_id, force=bool(force),
                                               reason=reason.strip() or None, eval_run=eval_run.strip() or None)
    except RagServiceError as exc:  # e.g. the candidate has not won: say why, and offer force
        return await _experiment_page(request, experiment_id, status_code=exc.status_code, error=exc.message,
                                      offer_force=True)
    return redirect(f"/review/experiments/{experiment_id}?promoted=1")


@router.post("/experiments/{experiment_id}/stop")
async def stop(request: Request, experiment_id: uuid.UUID, session: FormSessionDep,
               reason: Reason = "") -> Response:
    require_admin(session, "stop an experiment")
    try:
        await runtime(request).prompts.stop_experiment(session.caller, experiment_id, reason.strip() or None)
    except RagServiceError as exc:
        return await _experiment_page(request, experiment_id, status_code=exc.status_code, error=exc.message)
    return redirect(f"/review/experiments/{experiment_id}?stopped=1")
