"""Prometheus metrics of one process (``GET /metrics``), in a registry of its own.

Counted as things happen: HTTP requests per route template, each query's step latencies, LLM tokens
and cost, the evaluation scores, and the quality alert. Read from the database when scraped
(``ServiceMetrics.refresh``): the ingestion queue and the review queue, which every replica and
worker shares, so any replica reports the same figures.

The quality alert is the design's signal: a collection whose last 10 answers all scored overall
below 0.70. It is a gauge per collection (1 while the run lasts) and one warning in the log when
it starts.
"""

from __future__ import annotations

import logging
import re
from collections import deque
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from rag_service.domain import QueryResult
from rag_service.domain.costs import Prices, generation_cost
from rag_service.domain.monitoring import QueueFigures

log = logging.getLogger(__name__)

ALERT_BELOW = 0.70
ALERT_RUN = 10
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"})
_STEP_NUMBER = re.compile(r"-\d+$")
_SCORE_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


@dataclass
class QualityAlert:
    """Per collection, the overall scores of its last ``run`` answers; alerting while all are below
    ``below``. Pure state: ``observe`` says whether this answer started an alert."""

    below: float = ALERT_BELOW
    run: int = ALERT_RUN
    _recent: dict[str, deque[float]] = field(default_factory=dict)
    active: set[str] = field(default_factory=set)

    def observe(self, collection: str, overall: float) -> bool:
        recent = self._recent.setdefault(collection, deque(maxlen=self.run))
        recent.append(overall)
        alerting = len(recent) == self.run and all(score < self.below for score in recent)
        started = alerting and collection not in self.active
        if alerting:
            self.active.add(collection)
        else:
            self.active.discard(collection)
        return started


class ServiceMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Histogram("ragsvc_http_request_duration_seconds", "HTTP request latency by route template.",
                                  ["method", "route", "status"], buckets=_LATENCY_BUCKETS, registry=r)
        self.steps = Histogram("ragsvc_query_step_duration_seconds", "Latency of each query pipeline step.",
                               ["step"], buckets=_LATENCY_BUCKETS, registry=r)
        self.queries = Counter("ragsvc_queries_total", "Queries answered, by outcome.", ["outcome"], registry=r)
        self.tokens = Counter("ragsvc_llm_tokens_total", "LLM tokens the endpoint reported.", ["kind"], registry=r)
        self.cost = Counter("ragsvc_llm_cost_usd_total", "LLM cost from the configured prices.", registry=r)
        self.scores = Histogram("ragsvc_evaluation_score", "The evaluation's scores of each answer, per metric.",
                                ["metric"], buckets=_SCORE_BUCKETS, registry=r)
        self.alert = Gauge("ragsvc_quality_alert", f"1 while a collection's last {ALERT_RUN} answers all scored "
                           f"overall below {ALERT_BELOW}.", ["collection"], registry=r)
        self.jobs = Gauge("ragsvc_ingestion_jobs", "Ingestion jobs by status (queued: the queue's depth).",
                          ["status"], registry=r)
        self.reviews = Gauge("ragsvc_review_items", "Review queue items by status.", ["status"], registry=r)
        self.review_age = Gauge("ragsvc_review_open_age_seconds", "Age of the open review items.", ["quantile"],
                                registry=r)
        self.langfuse_dropped = Counter("ragsvc_langfuse_traces_dropped_total", "Traces not sent to Langfuse "
                                        "because its queue was full (Langfuse slow or down).", registry=r)
        self.database_up = Gauge("ragsvc_database_up", "1 when the last scrape read the queues from PostgreSQL.",
                                 registry=r)
        self._quality = QualityAlert()
        self.prices = Prices()  # the endpoint's prices, for the cost counter

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        # Label values from the request are bounded: any method token is accepted on the wire.
        method = method if method in _METHODS else "other"
        self.requests.labels(method, route, str(status)).observe(seconds)

    def observe_query(self, collection: str, result: QueryResult) -> None:
        self.queries.labels(result.outcome).inc()
        for step, ms in result.timings_ms.items():
            if step != "total":  # "retrieve-2" -> "retrieve": one series per kind of step, however many parts
                self.steps.labels(_STEP_NUMBER.sub("", step)).observe(ms / 1000)
        tokens = result.llm_tokens or {}
        for kind in ("prompt", "completion"):
            if tokens.get(kind):
                self.tokens.labels(kind).inc(tokens[kind])
        cost = generation_cost(result.generator, tokens, self.prices)
        if cost:
            self.cost.inc(cost)
        report = result.evaluation
        if report is None:
            return
        for metric, value in report.metrics.items():
            if value.value is not None:
                self.scores.labels(metric).observe(value.value)
        if report.overall is None:
            return
        self.scores.labels("overall").observe(report.overall)
        if self._quality.observe(collection, report.overall):
            log.warning("quality alert: the last %d answers in collection %r all scored overall below %.2f",
                        ALERT_RUN, collection, ALERT_BELOW)
        self.alert.labels(collection).set(1.0 if collection in self._quality.active else 0.0)

    def refresh(self, figures: QueueFigures) -> None:
        for status, count in figures.jobs_by_status.items():
            self.jobs.labels(status).set(count)
        for status, count in figures.reviews_by_status.items():
            self.reviews.labels(status).set(count)
        for quantile, age in figures.open_review_age_s.items():
            self.review_age.labels(quantile).set(age if age is not None else 0.0)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
