"""Langfuse tracing, on when ``RAGSVC_LANGFUSE_PUBLIC_KEY`` and ``RAGSVC_LANGFUSE_SECRET_KEY`` are set.

Without both keys :meth:`LangfuseTracer.from_settings` returns None: no client, no thread, nothing sent,
nothing logged beyond one warning when only one key is set.

A finished query (job, eval run) hands its :class:`~rag_service.observability.trace_tree.TraceRecord`
to :meth:`LangfuseTracer.submit`, which only puts it on a bounded queue: a full queue drops the record
and counts it (``on_drop``, the ``ragsvc_langfuse_traces_dropped_total`` counter), so a slow or dead
Langfuse never holds a query back. One thread takes records off the queue and turns each into spans of
the Langfuse SDK (v5, OpenTelemetry-based); the SDK's batch processor sends them to
``/api/public/otel/v1/traces`` and its score thread sends scores to ``/api/public/scores``, each with
its own bounded buffer and retries, off the query's path.

The spans are made after the fact with the times the pipeline recorded, which the SDK's public
``start_observation`` cannot do (it has no start time). So this module does what the SDK does inside
``start_observation(as_type="event")``: it starts an OpenTelemetry span on the client's tracer with an
explicit ``start_time`` and wraps it in the SDK's public observation class (``LangfuseSpan``,
``LangfuseGeneration``, ...), which writes Langfuse's attributes (with the client's ``mask`` applied),
then ends it at the recorded time. The one private name used is ``Langfuse._otel_tracer``; the tests
against the fake Langfuse catch an SDK that changes it.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import queue
import random
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from opentelemetry import trace as otel
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from rag_service.observability.trace_tree import Observation, TraceRecord, sampled
from rag_service.text.walk import map_strings

log = logging.getLogger(__name__)

DEFAULT_HOST = "https://cloud.langfuse.com"
# Traces turned into spans before each export. A query is 12-25 spans; the SDK's span buffer holds 2,048
# and silently drops the oldest beyond that, so a batch must stay well below it.
BATCH = 20
TIMEOUT_S = 5  # each request to Langfuse
GATHER_S = 0.5  # how long the sender collects traces before an export


class LangfuseTracer:
    def __init__(self, client: Any, *, queue_size: int = 1000, on_drop: Callable[[], None] | None = None,
                 environment: str | None = None, redact: Callable[[str], str] | None = None,
                 redact_message: Callable[[str], str] | None = None, sample_rate: float = 1.0) -> None:
        self._client = client
        self._sample_rate = sample_rate
        self._redact = redact or (lambda text: text)
        self._redact_message = redact_message or self._redact
        self._environment = environment
        self._on_drop = on_drop
        self._queue: queue.Queue[TraceRecord | None] = queue.Queue(maxsize=queue_size)
        self.dropped = 0
        self.sent = 0
        self.failed = 0
        self._idle = threading.Condition()
        self._pending = 0
        self._thread = threading.Thread(target=self._work, name="langfuse-tracer", daemon=True)
        self._thread.start()

    @classmethod
    def from_settings(cls, settings: Any, *, redact: Callable[[str], str] | None = None,
                      redact_message: Callable[[str], str] | None = None,
                      on_drop: Callable[[], None] | None = None) -> LangfuseTracer | None:
        """None without both keys, or when the SDK cannot be set up (logged): tracing never stops
        the service. ``redact`` runs over every string sent (secrets, keys, passwords); what comes from
        users arrives PII-masked already. ``redact_message`` (default ``redact``) runs over status
        messages, which are error texts: the log redactor, personal data included."""
        public_key = _secret(settings.langfuse_public_key)
        secret_key = _secret(settings.langfuse_secret_key)
        if not public_key or not secret_key:
            if public_key or secret_key:
                log.warning("Langfuse tracing is off: it needs both RAGSVC_LANGFUSE_PUBLIC_KEY and "
                            "RAGSVC_LANGFUSE_SECRET_KEY, and only one is set")
            return None
        host = (settings.langfuse_host or "").strip().rstrip("/") or DEFAULT_HOST
        try:
            client = _client(public_key, secret_key, host, settings.environment, redact)
        except Exception as exc:  # e.g. a LANGFUSE_* variable the SDK reads itself and cannot parse
            log.error("Langfuse tracing is off: the SDK could not be set up (%s: %s)", type(exc).__name__,
                      (redact or str)(str(exc))[:300])
            return None
        log.info("Langfuse tracing on: traces go to %s", host)
        return cls(client, queue_size=settings.langfuse_queue_size, on_drop=on_drop, environment=settings.environment,
                   redact=redact, redact_message=redact_message, sample_rate=settings.langfuse_sample_rate)

    # --- the query's side: never blocks ------------------------------------------------------
    def submit(self, record: TraceRecord) -> bool:
        """Queue a trace for sending; False (and counted) when the queue is full. A query's record outside
        the sample is skipped (True: nothing was lost)."""
        if record.name == "query" and not sampled(record.trace_id, self._sample_rate):
            return True
        with self._idle:
            self._pending += 1
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            with self._idle:
                self._pending -= 1
                self._idle.notify_all()
            self.dropped += 1
            if self._on_drop is not None:
                self._on_drop()
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.warning("Langfuse trace queue full: %d trace(s) dropped so far (Langfuse slow or down?)",
                            self.dropped)
            return False
        return True

    # --- the sending thread ---------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            batch = [self._queue.get()]
            # Gather for a moment: fewer, larger exports cost less per trace than one per query.
            until = time.monotonic() + GATHER_S
            while len(batch) < BATCH and batch[-1] is not None and (wait := until - time.monotonic()) > 0:
                try:
                    batch.append(self._queue.get(timeout=wait))
                except queue.Empty:
                    break
            records = [r for r in batch if r is not None]
            for record in records:
                try:
                    self._send(record)
                    self.sent += 1
                except Exception:  # one bad record must not stop tracing
                    self.failed += 1
                    log.exception("Langfuse trace %s (%s) not sent", record.trace_id, record.name)
            try:
                # Export here, in this thread: the SDK's own buffer stays near empty, and a slow
                # Langfuse holds up this thread, so records pile up in (and are dropped from) the
                # bounded queue above, where they are counted.
                self._client.flush()
            except Exception:
                log.exception("Langfuse export failed")
            with self._idle:
                self._pending -= len(records)
                self._idle.notify_all()
            if len(records) < len(batch):
                return

    def _send(self, record: TraceRecord) -> None:
        # The remote parent fixes the trace id (the query id); AS_ROOT makes the root span the trace's
        # root in Langfuse although OpenTelemetry sees a parent.
        if record.root is not None:
            parent = NonRecordingSpan(SpanContext(trace_id=int(record.trace_id, 16),
                                                  span_id=random.getrandbits(64) or 1, is_remote=True,
                                                  trace_flags=TraceFlags(TraceFlags.SAMPLED)))
            self._emit(record.root, otel.set_span_in_context(parent),
                       trace_attributes=_trace_attributes(record, self._redact))
        for score in record.scores:  # on the trace, not an observation: a late grade replaces it by id
            self._client.create_score(name=score.name, value=score.value, trace_id=record.trace_id,
                                      score_id=score.id, data_type="NUMERIC", comment=score.comment)

    def _emit(self, node: Observation, context: Any, trace_attributes: dict[str, Any] | None = None) -> None:
        from langfuse import LangfuseOtelSpanAttributes

        span = self._client._otel_tracer.start_span(name=node.name, context=context, start_time=_ns(node.start))
        if trace_attributes is not None:
            span.set_attribute(LangfuseOtelSpanAttributes.AS_ROOT, True)
            for key, value in trace_attributes.items():
                span.set_attribute(key, value)
        fields: dict[str, Any] = {"input": node.input, "output": node.output, "metadata": node.metadata or None,
                                  "level": node.level, "environment": self._environment,
                                  # the SDK's mask hook does not cover the status message
                                  "status_message": self._redact_message(node.status_message)
                                  if node.status_message else None}
        if node.kind == "generation":
            fields.update(model=node.model, usage_details=node.usage, cost_details=node.cost)
        observation = _observation_classes()[node.kind](otel_span=span, langfuse_client=self._client, **fields)
        if node.prompt is not None:
            span.set_attribute(LangfuseOtelSpanAttributes.OBSERVATION_PROMPT_NAME, node.prompt[0])
            span.set_attribute(LangfuseOtelSpanAttributes.OBSERVATION_PROMPT_VERSION, node.prompt[1])
        child_context = otel.set_span_in_context(span)
        for child in node.children:
            # Hand the GIL back between spans: this thread is pure-Python work, and without a pause the
            # event loop serving queries waits out the interpreter's 5 ms switch interval behind it.
            time.sleep(0)
            self._emit(child, child_context)
        observation.end(end_time=_ns(node.end))

    # --- shutdown and tests -------------------------------------------------------------------------
    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until every queued trace has been sent (or failed). False when that took longer than
        ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._idle:
            while self._pending > 0:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._idle.wait(remaining)
        return True

    def close(self, timeout_s: float = 5.0) -> None:
        """Send what is queued, stop the thread and the SDK: all within about ``timeout_s`` (what is
        still unsent then is lost, as in an outage)."""
        deadline = time.monotonic() + timeout_s
        self.flush(timeout_s)
        with contextlib.suppress(queue.Full):  # a full queue: the thread is a daemon and dies with the process
            self._queue.put_nowait(None)
        self._thread.join(max(0.0, deadline - time.monotonic()))
        # The SDK's shutdown flushes without a time limit (its score queue retries with backoff): in a
        # daemon thread of its own, waited for only until the deadline.
        stopper = threading.Thread(target=self._client.shutdown, name="langfuse-shutdown", daemon=True)
        stopper.start()
        stopper.join(max(0.1, deadline - time.monotonic()))


@functools.cache
def _observation_classes() -> dict[str, Any]:
    """The SDK's observation class for each kind of node (imported once tracing is on)."""
    from langfuse import (
        LangfuseChain,
        LangfuseEvaluator,
        LangfuseEvent,
        LangfuseGeneration,
        LangfuseGuardrail,
        LangfuseRetriever,
        LangfuseSpan,
    )

    return {"span": LangfuseSpan, "generation": LangfuseGeneration, "event": LangfuseEvent,
            "retriever": LangfuseRetriever, "guardrail": LangfuseGuardrail, "evaluator": LangfuseEvaluator,
            "chain": LangfuseChain}


def _client(public_key: str, secret_key: str, host: str, environment: str, redact: Callable[[str], str] | None) -> Any:
    from langfuse import Langfuse  # imported only when tracing is on: it starts OpenTelemetry machinery

    from rag_service import __version__

    # A provider of our own: the SDK would otherwise install its provider as OpenTelemetry's global.
    provider = TracerProvider(resource=Resource.create({"service.name": "rag-service", "service.version": __version__}))
    mask = (lambda *, data, **_: map_strings(redact, data)) if redact is not None else None
    # Everything the SDK would otherwise take from LANGFUSE_* variables is given, so Settings decide.
    return Langfuse(public_key=public_key, secret_key=secret_key, base_url=host, timeout=TIMEOUT_S, mask=mask,
                    environment=environment, release=__version__, tracer_provider=provider, sample_rate=1.0,
                    tracing_enabled=True, flush_at=512, flush_interval=5.0)


def _trace_attributes(record: TraceRecord, redact: Callable[[str], str]) -> dict[str, Any]:
    """Trace-level attributes as the SDK's ``propagate_attributes`` writes them: metadata one
    JSON-encoded value per key (redacted here: the SDK's mask hook does not see them)."""
    from langfuse import LangfuseOtelSpanAttributes as A

    found: dict[str, Any] = {A.TRACE_NAME: record.name}
    if record.user_id:
        found[A.TRACE_USER_ID] = record.user_id
    if record.session_id:
        found[A.TRACE_SESSION_ID] = record.session_id
    if record.tags:
        found[A.TRACE_TAGS] = list(record.tags)
    for key, value in record.metadata.items():
        if value is not None:
            found[f"{A.TRACE_METADATA}.{key}"] = redact(json.dumps(value, separators=(",", ":"), ensure_ascii=False,
                                                                    default=str))
    return found


def _ns(moment: datetime) -> int:
    return int(moment.timestamp() * 1_000_000_000)


def _secret(value: Any) -> str:
    if value is None:
        return ""
    raw = value.get_secret_value() if hasattr(value, "get_secret_value") else str(value)
    return raw.strip()
