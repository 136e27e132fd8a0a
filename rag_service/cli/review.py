"""``ragsvc review list|show|claim|decide|stats|expire``: the human-review queue from the terminal.

The CLI talks to the database directly, so it acts as the local operator (reviewer key id None),
like keyless requests to a loopback server. With ``--key`` (or ``RAGSVC_API_KEY``) it acts as
that API key instead: the key must have the reviewer (or admin) role, its collections limit what
it sees, and claims and decisions are recorded under its id, so a claim made through the API can
be decided from here with the same key.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from rag_service.cli.common import JsonFlag, app, emit_json, handle_errors, run_with_runtime, stderr, validated
from rag_service.domain import Caller, Role
from rag_service.domain.review import ReviewDecisionRequest, ReviewFilters
from rag_service.errors import ForbiddenError, InvalidInputError, UnauthorizedError

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from pydantic import BaseModel

    from rag_service.runtime import Runtime

review_app = typer.Typer(help="The human-review queue: list, show, claim and decide answers.", no_args_is_help=True)
app.add_typer(review_app, name="review")

LOCAL_OPERATOR = Caller(role="admin")
KeyOption = Annotated[str | None, typer.Option(
    "--key", envvar="RAGSVC_API_KEY", show_envvar=True,
    help="Act as this API key (reviewer or admin role) instead of the local operator.")]


async def acting_as(runtime: Runtime, key: str | None, needs: Role) -> Caller:
    """The caller a command acts as: the local operator, or the API key given, which must hold ``needs``."""
    if key is None:
        return LOCAL_OPERATOR
    found = await runtime.keys.authenticate(key)
    if found is None:
        raise UnauthorizedError("the API key is unknown or revoked")
    if not found.can(needs):
        raise ForbiddenError(f"this is a {found.role} key; this command needs the {needs} role (or admin)")
    return found


def _run(key: str | None, work: Callable[[Any, Caller], Awaitable[BaseModel | None]], learning: bool = False) -> Any:
    """Run ``work`` as the caller ``key`` names (or the local operator); its model as JSON data.
    ``work`` gets the review service, or with ``learning`` the one that also makes candidates."""

    async def run(runtime: Runtime) -> Any:
        caller = await acting_as(runtime, key, "reviewer")
        result = await work(runtime.learning if learning else runtime.reviews, caller)
        return None if result is None else result.model_dump(mode="json")

    return run_with_runtime(run)


def _ago(seconds: float) -> str:
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def _score(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


@review_app.command("list")
@handle_errors
def review_list(
    status: Annotated[str | None, typer.Option(help="pending, claimed, approved, rejected, edited or expired.")] = None,
    metric: Annotated[str | None, typer.Option(help="Only items that flagged this metric.")] = None,
    reason: Annotated[str | None, typer.Option(help="A substring of one of the reasons.")] = None,
    collection: Annotated[str | None, typer.Option("--collection", "-c")] = None,
    limit: Annotated[int, typer.Option(min=1, max=200)] = 20,
    offset: Annotated[int, typer.Option(min=0)] = 0,
    key: KeyOption = None,
    as_json: JsonFlag = False,
) -> None:
    """The queue in priority order (high tier first, then lower score, more traffic, older)."""
    filters = validated(lambda: ReviewFilters(status=status, metric=metric, reason=reason, collection=collection))
    page = _run(key, lambda reviews, caller: reviews.list(caller, filters, limit=limit, offset=offset))
    if as_json:
        emit_json(page)
        return
    table = Table(title=f"{len(page['data'])} of {page['count']} review items")
    for column in ("id", "status", "tier", "priority", "overall", "age", "traffic", "question", "reasons"):
        table.add_column(column, overflow="fold" if column in ("question", "reasons") else "ellipsis")
    for item in page["data"]:
        table.add_row(item["id"], item["status"], item["tier"], f"{item['priority']:.2f}", _score(item["overall"]),
                      _ago(item["age_s"]), str(item["traffic"]), Text(item["question"][:120]),
                      Text("; ".join(item["reasons"])[:160]))
    Console().print(table)


@review_app.command("show")
@handle_errors
def review_show(
    review_id: Annotated[uuid.UUID, typer.Argument(help="The review item's id.")],
    key: KeyOption = None,
    as_json: JsonFlag = False,
) -> None:
    """One item: question, answer, citations, the passages read, route, scores and decision."""
    item = _run(key, lambda reviews, caller: reviews.get(caller, review_id))
    if as_json:
        emit_json(item)
        return
    console = Console()
    console.print(f"[bold]{item['id']}[/] {item['status']} ({item['tier']}, priority {item['priority']:.2f}, "
                  f"overall {_score(item['overall'])}, queued {_ago(item['age_s'])} ago by {item['trigger']})",
                  highlight=False)
    console.print(Text(f"Q: {item['question']}"))
    console.print(Text(f"A: {item['answer']['text']}"))
    for citation in item["citations"]:
        console.print(Text(f"  [{citation['n']}] {citation['source_uri']} {citation['start_char']}-"
                           f"{citation['end_char']}: {citation['quote'][:160]}"))
    console.print(f"route: {item['route'].get('guideline') or 'default'}; reasons: " + "; ".join(item["reasons"]),
                  highlight=False)
    for scores in item["scores"]:
        console.print(f"{scores['scorer']}: overall {_score(scores['overall'])}", highlight=False)
        for metric, value in scores["metrics"].items():
            console.print(Text(f"  {metric} {_score(value['value'])}: {value['reason']}"))
    if item["decision"]:
        console.print(f"decision: {item['decision']['decision']} ({item['decision']['category']})", highlight=False)


@review_app.command("claim")
@handle_errors
def review_claim(
    review_id: Annotated[uuid.UUID | None, typer.Argument(help="The item; none: the next one in the queue.")] = None,
    key: KeyOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Claim an item (or the highest-priority unclaimed one) for RAGSVC_REVIEW_LEASE_S seconds.
    --json prints {"claim": {...}}, or {"claim": null} when nothing is left to claim."""
    if review_id is None:
        claim = _run(key, lambda reviews, caller: reviews.claim_next(caller))
    else:
        claim = _run(key, lambda reviews, caller: reviews.claim(caller, review_id))
    if as_json:
        emit_json({"claim": claim})
        return
    if claim is None:
        stderr.print("nothing to claim: the queue has no pending item")
        return
    stderr.print(f"claimed {claim['review_id']} until {claim['lease_expires_at']}", highlight=False)
    typer.echo(claim["review_id"])


@review_app.command("decide")
@handle_errors
def review_decide(
    review_id: Annotated[uuid.UUID, typer.Argument(help="A review item you have claimed.")],
    decision: Annotated[str, typer.Option(help="approved, rejected or edited.")],
    category: Annotated[str, typer.Option(help="routing, answer_quality, relevance or other.")],
    feedback: Annotated[str | None, typer.Option(help="Free text for the team.")] = None,
    corrected_answer: Annotated[str | None, typer.Option(help="Required with --decision edited.")] = None,
    corrected_prompt: Annotated[Path | None, typer.Option(
        help="A file with a prompt template that would have done better: becomes a candidate version.")] = None,
    corrected_routing: Annotated[str | None, typer.Option(
        help='JSON: {"guideline": NAME}, {"route": {...}} or a whole guideline; becomes a candidate guidelines '
             'version.')] = None,
    key: KeyOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Record a decision on an item you hold; approved and edited answers become golden items, and
    corrections become candidate prompt or guideline versions."""
    try:
        routing = json.loads(corrected_routing) if corrected_routing is not None else None
        prompt = corrected_prompt.read_text(encoding="utf-8") if corrected_prompt is not None else None
    except (json.JSONDecodeError, OSError) as exc:
        raise InvalidInputError(f"--corrected-routing must be JSON and --corrected-prompt a readable file: {exc}") \
            from None
    request = validated(lambda: ReviewDecisionRequest(decision=decision, category=category, feedback=feedback,
                                                      corrected_answer=corrected_answer, corrected_prompt=prompt,
                                                      corrected_routing=routing))
    result = _run(key, lambda reviews, caller: reviews.decide(caller, review_id, request), learning=True)
    if as_json:
        emit_json(result)
        return
    golden = f"; golden item {result['golden_item_id']}" if result["golden_item_id"] else ""
    for what in ("prompt", "guidelines"):
        if result.get(f"candidate_{what}_version"):
            golden += f"; candidate {what} version {result[f'candidate_{what}_version']}"
    stderr.print(f"{review_id}: {result['decision']} ({result['category']}){golden}", highlight=False)


@review_app.command("stats")
@handle_errors
def review_stats(key: KeyOption = None, as_json: JsonFlag = False) -> None:
    """Queue length by state, waiting times, decisions, judge-human agreement per metric."""
    stats = _run(key, lambda reviews, caller: reviews.stats(caller))
    if as_json:
        emit_json(stats)
        return
    console = Console()
    console.print("by status: " + ", ".join(f"{k} {v}" for k, v in stats["by_status"].items()), highlight=False)
    if stats["open_age_s"]:
        console.print(f"open items waited: p50 {_ago(stats['open_age_s']['p50'])}, "
                      f"p95 {_ago(stats['open_age_s']['p95'])}", highlight=False)
    table = Table(title="judge-human agreement (Cohen's kappa)")
    for column in ("metric", "kappa", "n", "flagged", "corrected"):
        table.add_column(column)
    for metric, row in stats["agreement"].items():
        kappa = "undefined" if row["kappa"] is None else f"{row['kappa']:.2f}"
        table.add_row(metric, kappa, str(row["n"]), str(row["flagged"]), str(row["corrected"]))
    console.print(table)


@review_app.command("expire")
@handle_errors
def review_expire(as_json: JsonFlag = False) -> None:
    """Put lapsed claims back in the queue and expire items pending longer than
    RAGSVC_REVIEW_EXPIRE_AFTER_DAYS (listing does this too; run it from cron if nobody lists)."""

    async def upkeep(runtime: Runtime) -> dict[str, int]:
        done = await runtime.reviews.housekeep()
        return {"released": done.released, "expired": done.expired}

    result = run_with_runtime(upkeep)
    if as_json:
        emit_json(result)
    else:
        stderr.print(f"released {result['released']} lapsed claims, expired {result['expired']} items")
