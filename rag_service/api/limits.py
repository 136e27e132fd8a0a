"""Limits at the edge: requests per key, and work in flight per process.

- **Per key** (``RAGSVC_RATE_LIMIT``, default 1200/minute): checked by the role dependency once the
  request is authenticated (and by ``/mcp`` the same way), with the ``limits`` library's moving window
  in this process's memory, keyed by the key's id. The keyless local admin (no key exists, a loopback
  server: one person on their own machine) is not limited. Over the limit: 429 with ``Retry-After``
  (seconds until the window lets one more in). Counted per process: N replicas behind a balancer let
  a key through at up to N times the rate, the price of no shared store on the request path.
- **In flight** (``RAGSVC_MAX_INFLIGHT_QUERIES``, default 64): an ASGI layer counts the requests to
  the query and search routes (and ``/mcp``) until their response has gone, streams included; one
  more is a 503 with ``Retry-After: 1`` at once, rather than a queue whose latency has no bound.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable

from limits import parse_many
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter
from starlette.types import ASGIApp, Receive, Scope, Send

from rag_service.api.problems import problem_response
from rag_service.domain import Caller
from rag_service.errors import OverloadedError, RateLimitedError

# The routes that do a query's work: bounded in flight.
QUERY_PATHS = ("/v1/query", "/v1/query/stream", "/v1/search", "/mcp")
# For the responses of the routes under QUERY_PATHS.
OVERLOADED = {503: {"description": "The process is at RAGSVC_MAX_INFLIGHT_QUERIES (Retry-After: 1), or the "
                                   "database is unavailable"}}


class KeyRateLimit:
    def __init__(self, rate: str | None) -> None:
        self.rate = rate
        self._items = parse_many(rate) if rate else []
        self._limiter = MovingWindowRateLimiter(MemoryStorage())

    def check(self, caller: Caller) -> None:
        """Count one request of ``caller``; RateLimitedError when a window is full."""
        if not self._items or caller.key_id is None:
            return
        who = str(caller.key_id)
        for item in self._items:
            if not self._limiter.hit(item, who):
                reset = self._limiter.get_window_stats(item, who).reset_time
                raise RateLimitedError(
                    f"more than {item} requests for this key (RAGSVC_RATE_LIMIT {self.rate}); retry after "
                    "the Retry-After seconds", retry_after_s=math.ceil(max(0.0, reset - time.time())))


class InFlight:
    """How many query requests this process is serving, against its bound."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.current = 0
        self.refused = 0


class InFlightBound:
    """The ASGI layer that keeps ``InFlight.current`` at most ``limit`` for ``paths``."""

    def __init__(self, app: ASGIApp, state: InFlight, paths: Iterable[str] = QUERY_PATHS) -> None:
        self.app = app
        self.state = state
        self.paths = frozenset(paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].rstrip("/") not in self.paths:
            await self.app(scope, receive, send)
            return
        if self.state.current >= self.state.limit:
            self.state.refused += 1
            response = problem_response(OverloadedError(
                f"this server is already answering {self.state.limit} queries (RAGSVC_MAX_INFLIGHT_QUERIES); "
                "retry shortly, or spread the load over more replicas", retry_after_s=1))
            await response(scope, receive, send)
            return
        self.state.current += 1  # one event loop: no lock needed between the check and the count
        try:
            await self.app(scope, receive, send)
        finally:
            self.state.current -= 1


