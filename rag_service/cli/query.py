"""``ragsvc search`` and ``ragsvc ask``: the search and query APIs from the terminal."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from rag_service.cli.common import (
    JsonFlag,
    app,
    emit_json,
    handle_errors,
    model_json,
    parse_id,
    run_with_runtime,
    stderr,
    validated,
)
from rag_service.domain import EvaluateRequest, QueryRequest, QueryResult, SearchFilters, SearchRequest

if TYPE_CHECKING:
    from rag_service.runtime import Runtime


@app.command()
@handle_errors
def search(
    query: Annotated[str, typer.Argument(help="What to look for (quote it).")],
    collection: Annotated[str, typer.Option("--collection", "-c", help="Collection to search.")] = "default",
    top_k: Annotated[int, typer.Option("--top-k", "-k", help="Results to return.", min=1, max=100)] = 10,
    strategy: Annotated[list[str] | None, typer.Option(
        help="semantic, keyword, metadata or pattern (repeatable; default: the configured set).")] = None,
    tag: Annotated[list[str] | None, typer.Option(help="Only documents with any of these tags (repeatable).")] = None,
    lob: Annotated[str | None, typer.Option(help="Only documents of this line of business.")] = None,
    principal: Annotated[list[str] | None, typer.Option(
        help="Caller principal for documents with an ACL (repeatable).")] = None,
    rerank: Annotated[bool | None, typer.Option("--rerank/--no-rerank", help="Default: as configured.")] = None,
    adaptive: Annotated[bool | None, typer.Option("--adaptive/--no-adaptive",
                                                  help="Default: as configured.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Search a collection: strategies run concurrently, are fused (RRF) and reranked. Shows each
    hit's source, score and rank per strategy; --json adds text, offsets and the loop's iterations."""
    from rag_service.pipeline.retrieval.search import search as run_search

    request = validated(lambda: SearchRequest(
        query=query, collection=collection, top_k=top_k, strategies=strategy or None,
        filters=SearchFilters(tags_any=tag or [], lob=lob), principals=principal or [],
        rerank=rerank, adaptive=adaptive,
    ))
    result = model_json(lambda runtime: run_search(runtime.retriever, runtime.catalog, request))
    if as_json:
        emit_json(result)
        return
    confidence = "n/a" if result["confidence"] is None else f"{result['confidence']:.2f}"
    table = Table(title=f"{len(result['results'])} results for {query!r} in {collection} "
                        f"({result['elapsed_ms']:.0f} ms, confidence {confidence})")
    for column in ("#", "score", "source", "ranks", "text"):
        table.add_column(column, overflow="fold" if column == "text" else "ellipsis")
    for hit in result["results"]:
        ranks = " ".join(f"{name}:{rank}" for name, rank in hit["ranks"].items())
        snippet = " ".join(hit["text"].split())[:160]
        table.add_row(str(hit["rank"]), f"{hit['score']:.3f}", Text(hit["source_uri"]), ranks, Text(snippet))
    Console().print(table)
    if result["rerank"] and result["rerank"]["error"]:
        stderr.print(f"[yellow]reranker[/]: {result['rerank']['error']}")


@app.command()
@handle_errors
def ask(
    question: Annotated[str, typer.Argument(help="The question (quote it).")],
    collection: Annotated[str, typer.Option("--collection", "-c", help="Collection to ask about.")] = "default",
    conversation: Annotated[str | None, typer.Option(
        help="Conversation id: follow-ups with the same id may refer to earlier questions.")] = None,
    principal: Annotated[list[str] | None, typer.Option(
        help="Caller principal for documents with an ACL (repeatable).")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Ask a question and get an answer with its sources (or the questions to clarify it).
    Without an LLM configured the answer is extractive: the best sentences, cited."""
    request = validated(lambda: QueryRequest(question=question, collection=collection,
                                              conversation_id=conversation, principals=principal or []))
    async def answer(runtime: Runtime) -> QueryResult:
        result = await runtime.pipeline.run(request)
        await runtime.pipeline.drain(timeout_s=runtime.settings.eval_judge_budget_s)  # the LLM grades, if any
        return result

    result = model_json(answer)
    if as_json:
        emit_json(result)
        return
    show_result(Console(), result)


def show_result(console: Console, result: dict) -> None:
    """A query result as `ragsvc ask` prints it (status lines go to stderr)."""
    if result["outcome"] == "clarification":
        console.print("[bold]Could you clarify?[/]")
        for item in result["clarification"]["questions"]:
            console.print(Text(f"  - {item}"))
        return
    # Document text is printed as text: a "[/x]" in a source must not be read as Rich markup.
    console.print(result["answer"], markup=False, highlight=False)
    if result.get("short_answer"):
        console.print(Text.assemble(("\nShort answer: ", "bold"), result["short_answer"]))
    if result["citations"]:
        console.print("\n[bold]Sources[/]")
        for c in result["citations"]:
            line = Text(f"  [{c['n']}] {c['title'] or c['source_uri']} ({c['source_uri']}, "
                        f"chars {c['start_char']}-{c['end_char']})")
            if not c["verified"]:
                line.append(" (not verified)", style="yellow")
            console.print(line)
    if result.get("closest_sources"):
        console.print("\n[bold]Closest passages[/] (they do not answer the question)")
        for c in result["closest_sources"]:
            console.print(Text(f"  {c['title'] or c['source_uri']} ({c['source_uri']}): {c['quote'][:120]}"))
    if result.get("evaluation"):
        print_evaluation(console, result["evaluation"])
    if result.get("review_id"):
        stderr.print(Text(f"queued for review: {result['review_id']}", style="yellow"))
    if result["outcome"] == "no_answer":
        stderr.print(Text(f"no answer in the documents (probability {result['confidence']:.2f} that the closest "
                          f"passage answers), {result['timings_ms']['total']:.0f} ms", style="dim"))
    if result["outcome"] == "answered":
        extra = f"; {result['fallback_reason']}" if result.get("fallback_reason") else ""
        stderr.print(Text(f"{result['generator']} answer, confidence {result['confidence']:.2f}, "
                          f"{result['timings_ms']['total']:.0f} ms{extra}", style="dim"))


def print_evaluation(console: Console, evaluation: dict) -> None:
    """The seven grades as a small table, the overall score in its title."""
    overall = "n/a" if evaluation["overall"] is None else f"{evaluation['overall']:.2f}"
    verdict = "needs review" if evaluation["needs_review"] else "ok"
    table = Table(title=f"Evaluation: overall {overall} ({verdict})", title_justify="left")
    for column in ("metric", "value", "scorer", "reason"):
        table.add_column(column, overflow="fold" if column == "reason" else "ellipsis")
    for name, metric in evaluation["metrics"].items():
        value = "n/a" if metric["value"] is None else f"{metric['value']:.2f}"
        table.add_row(name, value, metric["scorer"], Text(metric["reason"]))
    console.print(table)


@app.command()
@handle_errors
def evaluate(
    question: Annotated[str | None, typer.Option("--question", "-q", help="The question that was asked.")] = None,
    answer: Annotated[str | None, typer.Option("--answer", "-a",
                                               help="The answer to grade; [n] cites context n.")] = None,
    context: Annotated[list[str] | None, typer.Option(
        "--context", help="A passage the answer was built from (repeatable; [1] is the first).")] = None,
    reference: Annotated[str | None, typer.Option(help="A reference answer, if there is one.")] = None,
    file: Annotated[Path | None, typer.Option(
        "--file", "-f", help='A JSON file with {"question", "answer", "contexts", "reference"} instead of options '
                             '("-" reads standard input).')] = None,
    as_json: JsonFlag = False,
) -> None:
    """Grade an answer produced elsewhere on the seven metrics, with the scorers `ragsvc ask` uses
    (the same as POST /v1/evaluate). Nothing is stored."""
    from rag_service.pipeline.evaluation import evaluate_answer

    if file is not None:
        raw = sys.stdin.read() if str(file) == "-" else file.read_text(encoding="utf-8")
        request = validated(lambda: EvaluateRequest.model_validate_json(raw))
    elif question is None or answer is None:
        raise typer.BadParameter("give --question and --answer (and --context), or --file")
    else:
        request = validated(lambda: EvaluateRequest(question=question, answer=answer, contexts=context or [],
                                                    reference=reference))
    result = model_json(lambda runtime: evaluate_answer(runtime.evaluator, runtime.intent_parser, request))
    if as_json:
        emit_json(result)
        return
    print_evaluation(Console(), result)


traces_app = typer.Typer(help="Stored query traces (GET /v1/queries/{id}/trace).", no_args_is_help=True)
app.add_typer(traces_app, name="traces")


@traces_app.command("show")
@handle_errors
def traces_show(query_id: Annotated[str, typer.Argument(help="The query_id an answer carried.")],
                as_json: JsonFlag = False) -> None:
    """A query's trace: steps and their times, route, each strategy's ranks, errors, evaluation."""
    wanted = parse_id(query_id, "a query id (query_id in an answer)")

    async def work(runtime: Runtime) -> dict:
        return (await runtime.query_trace(wanted)).model_dump(mode="json")

    found = run_with_runtime(work)
    if as_json:
        emit_json(found)
        return
    console = Console(stderr=True)
    console.print(f"query {found['query_id']} in {found['collection']}: {found['outcome']}; "
                  f"route {found['route'].get('guideline')}", highlight=False)
    for step in found["steps"]:
        console.print(f"  {step['id']:12s} {step['status']:8s} {step['elapsed_ms']:8.1f} ms"
                      f"{'  ' + step['detail'] if step.get('detail') else ''}", highlight=False)
    for error in found["errors"]:
        console.print(f"  [red]{error}[/]", highlight=False)


@traces_app.command("cleanup")
@handle_errors
def traces_cleanup(older_than_days: Annotated[float | None, typer.Option(
                       help="Default: RAGSVC_TRACE_RETENTION_DAYS.", min=0)] = None,
                   as_json: JsonFlag = False) -> None:
    """Delete stored traces past their retention (`ragsvc serve` also does this hourly)."""

    async def work(runtime: Runtime) -> dict:
        days = older_than_days if older_than_days is not None else runtime.settings.trace_retention_days
        return {"deleted": await runtime.traces.delete_older_than(days), "older_than_days": days}

    found = run_with_runtime(work)
    if as_json:
        emit_json(found)
    else:
        stderr.print(f"deleted {found['deleted']} traces older than {found['older_than_days']} days", highlight=False)
