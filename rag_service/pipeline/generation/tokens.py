"""Where a generator sends the answer's text as it is written (the SSE ``token`` events)."""

from collections.abc import Awaitable, Callable

TokenSink = Callable[[str], Awaitable[None]]
