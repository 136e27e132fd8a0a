"""``ragsvc experiments start|list|report|stop|promote``: experiments between two labels of a prompt
and promotion of the candidate, from the terminal. Like ``ragsvc prompts``, as the local operator or
``--key`` (reads need reviewer, writes admin)."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from rag_service.cli.common import JsonFlag, app, emit_json, handle_errors, stderr, validated
from rag_service.cli.prompts import EvalRunOption, json_data, run_as
from rag_service.cli.review import KeyOption
from rag_service.domain import Caller
from rag_service.domain.prompts import PRODUCTION, ExperimentRequest

if TYPE_CHECKING:
    from rag_service.runtime import Runtime

experiments_app = typer.Typer(help="Experiments between two labels of a prompt: start, list, report, stop, promote.",
                              no_args_is_help=True)
app.add_typer(experiments_app, name="experiments")


@experiments_app.command("start")
@handle_errors
def experiment_start(name: Annotated[str, typer.Argument(help="The prompt, e.g. answer_extractive.")],
                     control: Annotated[str, typer.Option(help="The control label.")] = PRODUCTION,
                     candidate: Annotated[str, typer.Option(help="The candidate label.")] = "candidate",
                     share: Annotated[float, typer.Option(help="The candidate's share of traffic.")] = 0.5,
                     alpha: Annotated[float, typer.Option(help="Error rate of the sequential test.")] = 0.05,
                     note: Annotated[str | None, typer.Option()] = None,
                     key: KeyOption = None, as_json: JsonFlag = False) -> None:
    """Send a share of traffic to the candidate label's version (sticky per conversation or key)."""
    request = validated(lambda: ExperimentRequest(name=name, control_label=control, candidate_label=candidate,
                                                  share=share, alpha=alpha, note=note))
    found = run_as(key, "admin", lambda rt, caller: rt.prompts.start_experiment(caller, request))
    if as_json:
        emit_json(found)
    else:
        typer.echo(found["id"])
        stderr.print(f"{name}: v{found['control_version']} ({control}) vs v{found['candidate_version']} "
                     f"({candidate}), {share:.0%} to the candidate", highlight=False)


@experiments_app.command("list")
@handle_errors
def experiment_list(name: Annotated[str | None, typer.Option()] = None, key: KeyOption = None,
                    as_json: JsonFlag = False) -> None:
    """Experiments, newest first."""

    async def work(rt: Runtime, _: Caller) -> dict[str, Any]:
        data, count = await rt.prompts.experiments.list(name)
        return {"data": json_data(data), "count": count}

    found = run_as(key, "reviewer", work)
    if as_json:
        emit_json(found)
        return
    for e in found["data"]:
        typer.echo(f"{e['id']} {e['name']} v{e['control_version']} vs v{e['candidate_version']} {e['status']}"
                   + (f": {e['stop_reason']}" if e["stop_reason"] else ""))


@experiments_app.command("report")
@handle_errors
def experiment_report(experiment_id: Annotated[uuid.UUID, typer.Argument()], key: KeyOption = None,
                      as_json: JsonFlag = False) -> None:
    """Per-variant statistics, the always-valid tests and the decision (applies the guardrail)."""
    found = run_as(key, "reviewer", lambda rt, _: rt.prompts.experiment_report(experiment_id))
    if as_json:
        emit_json(found)
        return
    console = Console()
    table = Table(title=f"experiment {experiment_id} ({found['experiment']['status']})")
    for column in ("variant", "version", "answers", "overall", "review rate", "approval", "p50 ms", "p95 ms"):
        table.add_column(column)
    for v in found["variants"]:
        table.add_row(v["variant"], str(v["version"]), str(v["answers"]), _num(v["overall_mean"]),
                      _num(v["review_rate"]), _num(v["approval_rate"]), _num(v["latency_ms_p50"], 0),
                      _num(v["latency_ms_p95"], 0))
    console.print(table)
    tests = Table(title="always-valid tests (mixture SPRT)")
    for column in ("metric", "difference", "confidence sequence", "p", "verdict"):
        tests.add_column(column)
    for c in found["comparisons"]:
        tests.add_row(c["metric"], _num(c["difference"], 3), f"[{_num(c['lower'], 3)}, {_num(c['upper'], 3)}]",
                      f"{c['p_value']:.4f}", c["verdict"])
    console.print(tests)
    console.print(f"decision: {found['decision']}: {found['decision_reason']}", highlight=False)


def _num(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


@experiments_app.command("stop")
@handle_errors
def experiment_stop(experiment_id: Annotated[uuid.UUID, typer.Argument()],
                    reason: Annotated[str | None, typer.Option()] = None,
                    key: KeyOption = None, as_json: JsonFlag = False) -> None:
    """Stop an experiment; all traffic returns to the control label."""
    found = run_as(key, "admin", lambda rt, caller: rt.prompts.stop_experiment(caller, experiment_id, reason))
    if as_json:
        emit_json(found)
    else:
        stderr.print(f"stopped {experiment_id}", highlight=False)


@experiments_app.command("promote")
@handle_errors
def experiment_promote(experiment_id: Annotated[uuid.UUID, typer.Argument()],
                       force: Annotated[bool, typer.Option("--force", help="Promote although the candidate has not "
                                                                           "won (recorded in the audit).")] = False,
                       reason: Annotated[str | None, typer.Option()] = None,
                       eval_run: EvalRunOption = None,
                       key: KeyOption = None, as_json: JsonFlag = False) -> None:
    """Move production to the candidate's version when it has won (or with --force) and the offline gate
    holds (--eval-run: a finished eval run made with the candidate)."""

    async def work(rt: Runtime, caller: Caller) -> dict[str, Any]:
        move, report = await rt.prompts.promote(caller, experiment_id, force=force, reason=reason, eval_run=eval_run)
        return {"move": json_data(move), "report": json_data(report)}

    found = run_as(key, "admin", work)
    if as_json:
        emit_json(found)
    else:
        move = found["move"]
        stderr.print(f"{move['name']}: production {move['from_version']} -> {move['to_version']}"
                     + (" (forced)" if move["forced"] else ""), highlight=False)
