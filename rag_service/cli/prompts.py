"""``ragsvc prompts ...`` and ``ragsvc guidelines ...``: versions and labels with their audit, and
candidates from reviews, from the terminal (experiments: ``experiments.py``).

Like ``ragsvc review``, the CLI acts as the local operator (an admin) unless ``--key`` names an
API key, which must have the admin role to write (reads need reviewer).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from rag_service.cli.common import JsonFlag, app, emit_json, handle_errors, run_with_runtime, stderr, validated
from rag_service.cli.review import KeyOption, acting_as
from rag_service.domain import Caller, Role
from rag_service.domain.prompts import (
    GUIDELINES_NAME,
    PRODUCTION,
    NewVersionRequest,
    PromptKind,
)
from rag_service.errors import InvalidInputError

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from rag_service.runtime import Runtime

prompts_app = typer.Typer(help="Prompt versions and labels: list, show, diff, create, label, rollback, propose.",
                          no_args_is_help=True)
guidelines_app = typer.Typer(help="The router's guideline versions and labels: list, show, diff, create, label, "
                                  "rollback.", no_args_is_help=True)
app.add_typer(prompts_app, name="prompts")
app.add_typer(guidelines_app, name="guidelines")

# Moving production: the offline gate's evidence (see evaluation/promotion.py).
EvalRunOption = Annotated[str | None, typer.Option(
    "--eval-run", help="Moving production: a finished eval run (id or name) made with this version; it must not "
                       "regress production's run on the same data.")]


NameArg = Annotated[str, typer.Argument(help="The prompt's name, e.g. answer_extractive.")]


def run_as(key: str | None, needs: Role, work: Callable[[Runtime, Caller], Awaitable[Any]]) -> Any:
    """``work`` run as the caller ``key`` names (which must hold ``needs``), its result as JSON data."""
    async def run(runtime: Runtime) -> Any:
        return json_data(await work(runtime, await acting_as(runtime, key, needs)))

    return run_with_runtime(run)


def json_data(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if isinstance(value, list):
        return [json_data(v) for v in value]
    return value


def _print_versions(versions: list[dict[str, Any]]) -> None:
    table = Table()
    for column in ("version", "labels", "source", "author", "parent", "created", "note"):
        table.add_column(column)
    for v in versions:
        table.add_row(str(v["version"]), ", ".join(v["labels"]), v["source"], v["author"] or "",
                      str(v["parent_version"] or ""), (v["created_at"] or "")[:19], (v["note"] or "")[:60])
    Console().print(table)


def _read_body(body_file: Path | None) -> str | None:
    if body_file is None:
        return None
    try:
        return body_file.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidInputError(f"cannot read {body_file}: {exc}") from None


def _register(typer_app: typer.Typer, kind: PromptKind) -> None:
    """The commands prompts and guidelines share; guidelines have one name (router)."""
    what = "prompt" if kind == "prompt" else "guidelines"

    @typer_app.command("list")
    @handle_errors
    def list_(key: KeyOption = None, as_json: JsonFlag = False) -> None:
        """Every versioned prompt (or the guidelines) with its labels."""
        found = run_as(key, "reviewer", lambda rt, _: _as_list(rt.prompt_repository.summaries(kind)))
        if as_json:
            emit_json({"data": found})
            return
        for s in found:
            labels = ", ".join(f"{k}={v}" for k, v in sorted(s["labels"].items()))
            typer.echo(f"{s['name']}: {s['versions']} versions, latest {s['latest_version']}; {labels}")

    def versions_(name: str, limit: int, key: str | None, as_json: bool) -> None:
        async def work(rt: Runtime, _: Caller) -> dict[str, Any]:
            data, count = await rt.prompt_repository.versions(kind, name, limit=limit)
            return {"data": json_data(data), "count": count}

        found = run_as(key, "reviewer", work)
        if as_json:
            emit_json(found)
        else:
            _print_versions(found["data"])

    def show_(name: str, version: int | None, key: str | None, as_json: bool) -> None:
        async def work(rt: Runtime, _: Caller) -> Any:
            if version is None:
                return await rt.prompt_repository.by_label(kind, name, PRODUCTION)
            return await rt.prompt_repository.version(kind, name, version)

        found = run_as(key, "reviewer", work)
        if as_json:
            emit_json(found)
            return
        stderr.print(f"{found['name']} v{found['version']} ({found['source']}, labels: "
                     f"{', '.join(found['labels']) or 'none'}); parameters {json.dumps(found['parameters'])}",
                     highlight=False)
        typer.echo(found["body"])

    def diff_(name: str, old: int, new: int, key: str | None, as_json: bool) -> None:
        found = run_as(key, "reviewer", lambda rt, _: rt.prompts.diff(kind, name, old, new))
        if as_json:
            emit_json(found)
            return
        typer.echo(found["body_diff"] or "(bodies are identical)")
        for parameter, (a, b) in found["parameters_changed"].items():
            typer.echo(f"parameter {parameter}: {a!r} -> {b!r}")

    def create_(name: str, body_file: Path | None, parameters: str | None, parent: int | None, note: str | None,
                label: str | None, key: str | None, as_json: bool) -> None:
        try:
            params = json.loads(parameters) if parameters is not None else None
        except json.JSONDecodeError as exc:
            raise InvalidInputError(f"--parameters must be a JSON object: {exc}") from None
        request = validated(lambda: NewVersionRequest(body=_read_body(body_file), parameters=params,
                                                      parent_version=parent, note=note, label=label))
        found = run_as(key, "admin", lambda rt, caller: rt.prompts.create(caller, kind, name, request))
        if as_json:
            emit_json(found)
        else:
            stderr.print(f"created {what} {name} version {found['version']}"
                         + (f" (label {label})" if label else ""), highlight=False)

    def label_(name: str, label: str, version: int, reason: str | None, eval_run: str | None, key: str | None,
               as_json: bool) -> None:
        found = run_as(key, "admin", lambda rt, caller: rt.prompts.move_label(caller, kind, name, label, version,
                                                                               reason, eval_run=eval_run))
        if as_json:
            emit_json(found)
        else:
            stderr.print(f"{name}: {label} {found['from_version']} -> {found['to_version']}", highlight=False)

    def rollback_(name: str, label: str, reason: str | None, key: str | None, as_json: bool) -> None:
        found = run_as(key, "admin", lambda rt, caller: rt.prompts.rollback(caller, kind, name, label, reason))
        if as_json:
            emit_json(found)
        else:
            stderr.print(f"{name}: {label} rolled back {found['from_version']} -> {found['to_version']}",
                         highlight=False)

    def history_(name: str, label: str | None, key: str | None, as_json: bool) -> None:
        found = run_as(key, "reviewer", lambda rt, _: _as_list(rt.prompt_repository.moves(kind, name, label)))
        if as_json:
            emit_json({"data": found})
            return
        for m in found:
            forced = " (forced)" if m["forced"] else ""
            typer.echo(f"{m['created_at'][:19]} {m['label']}: {m['from_version']} -> {m['to_version']} by "
                       f"{m['actor']}{forced}: {m['reason'] or ''}")

    # Prompts take the name as an argument; guidelines have only one.
    if kind == "prompt":
        @typer_app.command("versions")
        @handle_errors
        def versions(name: NameArg, limit: Annotated[int, typer.Option(min=1, max=200)] = 20,
                     key: KeyOption = None, as_json: JsonFlag = False) -> None:
            """The prompt's versions, newest first, with their labels."""
            versions_(name, limit, key, as_json)

        @typer_app.command("show")
        @handle_errors
        def show(name: NameArg, version: Annotated[int | None, typer.Option(help="Default: production.")] = None,
                 key: KeyOption = None, as_json: JsonFlag = False) -> None:
            """A version's body (stdout) and parameters."""
            show_(name, version, key, as_json)

        @typer_app.command("diff")
        @handle_errors
        def diff(name: NameArg, old: Annotated[int, typer.Argument()], new: Annotated[int, typer.Argument()],
                 key: KeyOption = None, as_json: JsonFlag = False) -> None:
            """A unified diff of two versions' bodies, and their changed parameters."""
            diff_(name, old, new, key, as_json)

        @typer_app.command("create")
        @handle_errors
        def create(name: NameArg,
                   body_file: Annotated[Path | None, typer.Option("--body-file", help="The template. Default: the "
                                                                                        "parent's.")] = None,
                   parameters: Annotated[str | None, typer.Option(help="JSON object. Default: the parent's.")] = None,
                   parent: Annotated[int | None, typer.Option(help="Default: production.")] = None,
                   note: Annotated[str | None, typer.Option()] = None,
                   label: Annotated[str | None, typer.Option(help="Point this label at it, e.g. candidate.")] = None,
                   key: KeyOption = None, as_json: JsonFlag = False) -> None:
            """Create a version (immutable), optionally labelled."""
            create_(name, body_file, parameters, parent, note, label, key, as_json)

        @typer_app.command("label")
        @handle_errors
        def label(name: NameArg, label: Annotated[str, typer.Argument(help="e.g. production, candidate.")],
                  version: Annotated[int, typer.Argument()],
                  reason: Annotated[str | None, typer.Option()] = None,
                  eval_run: EvalRunOption = None,
                  key: KeyOption = None, as_json: JsonFlag = False) -> None:
            """Point a label at a version (recorded; every process sees it at once)."""
            label_(name, label, version, reason, eval_run, key, as_json)

        @typer_app.command("rollback")
        @handle_errors
        def rollback(name: NameArg, label: Annotated[str, typer.Option()] = PRODUCTION,
                     reason: Annotated[str | None, typer.Option()] = None,
                     key: KeyOption = None, as_json: JsonFlag = False) -> None:
            """Point the label back at the version it pointed at before its last move."""
            rollback_(name, label, reason, key, as_json)

        @typer_app.command("history")
        @handle_errors
        def history(name: NameArg, label: Annotated[str | None, typer.Option()] = None,
                    key: KeyOption = None, as_json: JsonFlag = False) -> None:
            """Every label move: when, who, from, to, why."""
            history_(name, label, key, as_json)
    else:
        @typer_app.command("versions")
        @handle_errors
        def g_versions(limit: Annotated[int, typer.Option(min=1, max=200)] = 20, key: KeyOption = None,
                       as_json: JsonFlag = False) -> None:
            """The guidelines' versions, newest first, with their labels."""
            versions_(GUIDELINES_NAME, limit, key, as_json)

        @typer_app.command("show")
        @handle_errors
        def g_show(version: Annotated[int | None, typer.Option(help="Default: production.")] = None,
                   key: KeyOption = None, as_json: JsonFlag = False) -> None:
            """A version's guidelines (JSON on stdout)."""
            show_(GUIDELINES_NAME, version, key, as_json)

        @typer_app.command("diff")
        @handle_errors
        def g_diff(old: Annotated[int, typer.Argument()], new: Annotated[int, typer.Argument()],
                   key: KeyOption = None, as_json: JsonFlag = False) -> None:
            """A unified diff of two versions."""
            diff_(GUIDELINES_NAME, old, new, key, as_json)

        @typer_app.command("create")
        @handle_errors
        def g_create(body_file: Annotated[Path, typer.Option("--body-file", help="The guidelines as JSON.")],
                     note: Annotated[str | None, typer.Option()] = None,
                     label: Annotated[str | None, typer.Option(help="e.g. candidate or production.")] = None,
                     key: KeyOption = None, as_json: JsonFlag = False) -> None:
            """Create a guidelines version (validated as a whole), optionally labelled."""
            create_(GUIDELINES_NAME, body_file, None, None, note, label, key, as_json)

        @typer_app.command("label")
        @handle_errors
        def g_label(label: Annotated[str, typer.Argument()], version: Annotated[int, typer.Argument()],
                    reason: Annotated[str | None, typer.Option()] = None,
                    eval_run: EvalRunOption = None,
                    key: KeyOption = None, as_json: JsonFlag = False) -> None:
            """Point a label at a version (production: the router uses it at once)."""
            label_(GUIDELINES_NAME, label, version, reason, eval_run, key, as_json)

        @typer_app.command("rollback")
        @handle_errors
        def g_rollback(label: Annotated[str, typer.Option()] = PRODUCTION,
                       reason: Annotated[str | None, typer.Option()] = None,
                       key: KeyOption = None, as_json: JsonFlag = False) -> None:
            """Point the label back at the version it pointed at before its last move."""
            rollback_(GUIDELINES_NAME, label, reason, key, as_json)

        @typer_app.command("history")
        @handle_errors
        def g_history(label: Annotated[str | None, typer.Option()] = None,
                      key: KeyOption = None, as_json: JsonFlag = False) -> None:
            """Every label move: when, who, from, to, why."""
            history_(GUIDELINES_NAME, label, key, as_json)


async def _as_list(awaitable: Awaitable[list[Any]]) -> list[Any]:
    return json_data(await awaitable)


_register(prompts_app, "prompt")
_register(guidelines_app, "guidelines")


@prompts_app.command("propose")
@handle_errors
def propose(name: Annotated[str, typer.Argument(help="The prompt, e.g. answer_cot.")],
            last: Annotated[int, typer.Option(min=1, max=200, help="Recent approved/edited reviews to read.")] = 20,
            rewrite: Annotated[bool, typer.Option(help="With an LLM configured, let it rewrite the template from "
                                                       "the reviewers' feedback.")] = True,
            key: KeyOption = None, as_json: JsonFlag = False) -> None:
    """Build a candidate version (label candidate) from the last reviews of this prompt's answers."""
    found = run_as(key, "admin", lambda rt, caller: rt.learning.propose(caller, name, last=last, rewrite=rewrite))
    if as_json:
        emit_json(found)
    else:
        stderr.print(f"{name}: candidate version {found['version']} ({found['source']}; {found['note']}) from "
                     f"{len(found['review_ids'])} reviews", highlight=False)
