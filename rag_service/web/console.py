"""The reviewer console (server-rendered Jinja2 pages at /review): sign in with a reviewer or admin
key, work the review queue, follow prompts, their versions and experiments, and read eval run reports.

Plain HTML forms, no JavaScript. Each page module has its own router of ``ConsolePage`` routes
(errors become pages, a missing session a redirect to sign in); they are gathered here.
"""

from __future__ import annotations

from fastapi import APIRouter

from rag_service.web import eval_runs, experiments, prompts, queue, signin

PREFIX = "/review"

router = APIRouter(include_in_schema=False)
for pages in (signin.router, queue.router, prompts.router, experiments.router, eval_runs.router):
    # The prefix is given here rather than on ``router``: the queue lives at the prefix itself,
    # and FastAPI refuses a sub-router route whose prefix and path are both empty.
    router.include_router(pages, prefix=PREFIX, include_in_schema=False)
