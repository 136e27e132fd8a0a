"""``ragsvc eval run|resume|list|show|compare|report``: offline evaluation runs from the terminal.

A run goes through the real service in this process (a progress bar on stderr) and stores each
item's result as it finishes; ``resume`` continues an interrupted run, ``--queue`` leaves it to the
workers instead. Every command takes ``--json``.
"""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from rag_service.cli.common import JsonFlag, app, emit_json, handle_errors, run_with_runtime, stderr, validated
from rag_service.domain import EvalRun, EvalRunRequest
from rag_service.errors import InvalidInputError

if TYPE_CHECKING:
    from rag_service.runtime import Runtime

eval_app = typer.Typer(help="Offline evaluation runs: run, resume, list, show, compare, report.", no_args_is_help=True)
app.add_typer(eval_app, name="eval")

RunArgument = Annotated[str, typer.Argument(help="A run id, or the name of a run (its newest run).")]


def _pins(values: list[str]) -> dict[str, int]:
    pins: dict[str, int] = {}
    for value in values:
        name, _, version = value.partition("=")
        if not name or not version.strip().isdigit():
            raise InvalidInputError(f"--prompt {value!r}: write NAME=VERSION, e.g. answer_extractive=3")
        pins[name.strip()] = int(version)
    return pins


def _progress() -> Progress:
    # On stderr, so it shows with --json too (stdout holds only the JSON): a run can take hours.
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TimeRemainingColumn(), console=stderr, transient=False)


async def _execute(runtime: Runtime, run_id: uuid.UUID, *, force: bool = False, redo_failed: bool = False) -> EvalRun:
    await runtime.warm_up_embedder()
    with _progress() as bar:
        tasks: dict[str, Any] = {}

        def on_progress(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task("ingest corpus" if stage == "ingest" else "items", total=total)
            bar.update(tasks[stage], completed=done, total=total)

        return await runtime.eval_runner.execute(run_id, on_progress, force=force, redo_failed=redo_failed)


def _emit_run(run: dict[str, Any], as_json: bool) -> None:
    if as_json:
        emit_json(run)
    else:
        _show_run(run)


def _show_run(run: dict[str, Any]) -> None:
    dataset = run["dataset"]
    stderr.print(f"run {run['id']}{' (' + run['name'] + ')' if run['name'] else ''}: {run['status']}, "
                 f"{run['items_done']}/{run['items_total']} items ({run['items_failed']} failed); "
                 f"{dataset['kind']}:{dataset['name']} version {dataset['version']}"
                 f"{' split ' + dataset['split'] if dataset.get('split') else ''}, mode {run['mode']}, "
                 f"collection {run['collection']}, config {run['config_hash']}", highlight=False)
    metrics = (run.get("summary") or {}).get("metrics") or {}
    if metrics:
        table = Table("metric", "mean", "n")
        for name, value in metrics.items():
            table.add_row(name, "–" if value["mean"] is None else f"{value['mean']:.4f}", str(value["n"]))
        stderr.print(table)
    if run.get("error"):
        stderr.print(f"[red]error[/]: {run['error']}", highlight=False)


@eval_app.command("run")
@handle_errors
def eval_run(
    dataset: Annotated[str, typer.Option(help="beir:DIR (a BEIR directory), qa:FILE (question/answer JSONL) or "
                                              "golden (the reviewers' golden items).")],
    split: Annotated[str, typer.Option(help="The BEIR qrels split.")] = "test",
    mode: Annotated[str, typer.Option(help="retrieval (IR metrics) or full (answers, the seven grades and "
                                           "answer metrics too).")] = "retrieval",
    collection: Annotated[str | None, typer.Option(help="Run against this collection (default: one named after "
                                                        "the dataset version, ingested once).")] = None,
    limit: Annotated[int | None, typer.Option(help="Only the first N items.")] = None,
    concurrency: Annotated[int, typer.Option(help="Items in flight at once.")] = 4,
    repeat: Annotated[int, typer.Option(help="Times each item is run.")] = 1,
    name: Annotated[str | None, typer.Option(help="A name to find the run by.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the run's resampling (compare, reports).")] = 0,
    prompt: Annotated[list[str] | None, typer.Option(help="NAME=VERSION: answer with this prompt version instead of "
                                                          "production (repeatable; guidelines=N pins the router's).")]
    = None,
    queue: Annotated[bool, typer.Option("--queue", help="Record the run and leave it to the workers.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Run a dataset through the service and store one result per item (resumable)."""
    request = validated(lambda: EvalRunRequest(
        dataset=dataset, split=split, mode=mode, collection=collection, limit=limit, concurrency=concurrency,
        repeat=repeat, name=name, seed=seed, prompts=_pins(prompt or [])))

    async def work(runtime: Runtime) -> dict[str, Any]:
        run = await runtime.eval_runner.create(request, created_by="cli")
        if not as_json:
            stderr.print(f"run {run.id}: {run.items_total} items on {run.dataset.kind}:{run.dataset.name} "
                         f"(version {run.dataset.version}), collection {run.collection}", highlight=False)
        if queue:
            await runtime.enqueue_eval_run(run.id)
            return (await runtime.eval_runs.get(run.id)).model_dump(mode="json")
        return (await _execute(runtime, run.id)).model_dump(mode="json")

    _emit_run(run_with_runtime(work, check_schema=True), as_json)


@eval_app.command("resume")
@handle_errors
def eval_resume(run: RunArgument,
                force: Annotated[bool, typer.Option("--force", help="Even if it reported progress in the last "
                                                                    "minute (its process is known to be gone).")]
                = False, as_json: JsonFlag = False) -> None:
    """Continue an interrupted or failed run, or redo a finished run's failed items; items already
    stored without an error are not run again."""

    async def work(runtime: Runtime) -> dict[str, Any]:
        found = await runtime.eval_runs.find(run)
        return (await _execute(runtime, found.id, force=force, redo_failed=True)).model_dump(mode="json")

    _emit_run(run_with_runtime(work, check_schema=True), as_json)


@eval_app.command("list")
@handle_errors
def eval_list(limit: Annotated[int, typer.Option(min=1, max=500)] = 20,
              offset: Annotated[int, typer.Option(min=0)] = 0, as_json: JsonFlag = False) -> None:
    """Runs, newest first."""

    async def work(runtime: Runtime) -> dict[str, Any]:
        runs, total = await runtime.eval_runs.list(limit=limit, offset=offset)
        return {"data": [r.model_dump(mode="json") for r in runs], "count": total}

    found = run_with_runtime(work)
    if as_json:
        emit_json(found)
        return
    table = Table("id", "name", "status", "dataset", "mode", "items", "created")
    for r in found["data"]:
        table.add_row(r["id"], r["name"] or "", r["status"], f"{r['dataset']['name']}@{r['dataset']['version'][:8]}",
                      r["mode"], f"{r['items_done']}/{r['items_total']}", r["created_at"][:19])
    stderr.print(table)
    stderr.print(f"{len(found['data'])} of {found['count']}", highlight=False)


@eval_app.command("show")
@handle_errors
def eval_show(run: RunArgument,
              items: Annotated[int, typer.Option(help="Also list the first N item results.", min=0)] = 0,
              as_json: JsonFlag = False) -> None:
    """One run's record and summary (and item results with --items)."""

    async def work(runtime: Runtime) -> dict[str, Any]:
        found = await runtime.eval_runs.find(run)
        payload = found.model_dump(mode="json")
        if items:
            results = await runtime.eval_runs.results(found.id, limit=items)
            payload["results"] = [r.model_dump(mode="json") for r in results]
        return payload

    found = run_with_runtime(work)
    if as_json:
        emit_json(found)
        return
    _show_run(found)
    for result in found.get("results", []):
        stderr.print(f"{result['item_id']}#{result['repetition']}: {result['error'] or result['metrics']}",
                     highlight=False)


def _fmt(value: float | None, signed: bool = False) -> str:
    return "-" if value is None else (f"{value:+.4f}" if signed else f"{value:.4f}")


@eval_app.command("compare")
@handle_errors
def eval_compare(run_a: Annotated[str, typer.Argument(help="The baseline run (id or name).")],
                 run_b: Annotated[str, typer.Argument(help="The candidate run (id or name).")],
                 allow_different_datasets: Annotated[bool, typer.Option(
                     "--allow-different-datasets", help="Compare runs on different dataset versions anyway.")]
                 = False,
                 worst: Annotated[int, typer.Option(help="Items that got worse most, to list.", min=0)] = 10,
                 as_json: JsonFlag = False) -> None:
    """Per metric: B - A with a paired bootstrap 95% CI, a paired randomisation p-value and Holm's
    correction across metrics; the items that got worse most."""
    from evaluation.comparisons import compare_runs

    async def work(runtime: Runtime) -> dict[str, Any]:
        found = await compare_runs(runtime.eval_runs, run_a, run_b, worst=worst,
                                   allow_different_datasets=allow_different_datasets)
        return {"run_a": str(found.run_a.id), "run_b": str(found.run_b.id), "seconds": round(found.seconds, 3),
                **found.comparison.model_dump(mode="json")}

    found = run_with_runtime(work)
    if as_json:
        emit_json(found)
        return
    table = Table("metric", "n", "A", "B", "B - A", "95% CI", "p", "Holm p", "")
    for m in found["metrics"]:
        ci = f"{_fmt(m['ci_low'], True)} to {_fmt(m['ci_high'], True)}" if m["ci_low"] is not None else "-"
        table.add_row(m["metric"], str(m["n"]), _fmt(m["mean_a"]), _fmt(m["mean_b"]), _fmt(m["difference"], True),
                      ci, _fmt(m["p_value"]), _fmt(m["p_holm"]), m["direction"])
    stderr.print(table)
    if found["worst_items"]:
        stderr.print(f"worse most on {found['worst_by']}: " + ", ".join(
            f"{w['item_id']} (-{w['regression']:.3f})" for w in found["worst_items"]), highlight=False)
    stderr.print(f"compared in {found['seconds']:.2f} s", highlight=False)


@eval_app.command("report")
@handle_errors
def eval_report(run: RunArgument,
                against: Annotated[str | None, typer.Option(help="A baseline run to compare with (id or name).")]
                = None,
                fmt: Annotated[str, typer.Option("--format", help="md or html (one self-contained file).")] = "html",
                output: Annotated[Path | None, typer.Option("--output", "-o", help="Where to write it (default: "
                                                                                  "eval-report-<run>.<format>).")]
                = None,
                allow_different_datasets: Annotated[bool, typer.Option("--allow-different-datasets")] = False,
                as_json: JsonFlag = False) -> None:
    """Write a Markdown or HTML report with tables and plots (distributions, deltas with CIs, latency,
    score vs. retrieval rank)."""
    if fmt not in ("md", "html"):
        raise InvalidInputError(f"--format {fmt!r}: give md or html")
    chosen: Literal["md", "html"] = "md" if fmt == "md" else "html"
    from evaluation.comparisons import compare_runs
    from evaluation.reports import write_report

    async def work(runtime: Runtime) -> dict[str, Any]:
        started = time.perf_counter()
        if against is not None:
            found = await compare_runs(runtime.eval_runs, against, run, with_results=True,
                                       allow_different_datasets=allow_different_datasets)
            target, results = found.run_b, found.results_b
            extra = {"against": found.run_a, "against_results": found.results_a, "comparison": found.comparison}
        else:
            target = await runtime.eval_runs.find(run)
            results, extra = await runtime.eval_runs.results(target.id), {}
        stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", target.name or str(target.id)[:8]).strip(".-") or str(target.id)[:8]
        path = output or Path(f"eval-report-{stem}.{chosen}")
        written = write_report(path, chosen, target, results, **extra)
        return {"run": str(target.id), "path": str(written.resolve()), "format": chosen,
                "seconds": round(time.perf_counter() - started, 2)}

    found = run_with_runtime(work)
    if as_json:
        emit_json(found)
    else:
        typer.echo(found["path"])
