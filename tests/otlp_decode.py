"""Reading what an OpenTelemetry exporter sent over OTLP/HTTP (protobuf, maybe gzip), for the fakes."""

from __future__ import annotations

import gzip
import json
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


def decode_spans(raw: bytes, content_encoding: str | None) -> list[dict[str, Any]]:
    """Every span in one export request: ids as hex, times in ns, attributes as plain values (JSON-looking
    strings are left as strings: Langfuse's attributes hold JSON text)."""
    if (content_encoding or "").lower() == "gzip":
        raw = gzip.decompress(raw)
    request = ExportTraceServiceRequest()
    request.ParseFromString(raw)
    spans = []
    for resource in request.resource_spans:
        for scope in resource.scope_spans:
            for span in scope.spans:
                spans.append({
                    "trace_id": span.trace_id.hex(), "span_id": span.span_id.hex(),
                    "parent_span_id": span.parent_span_id.hex() or None, "name": span.name,
                    "start_ns": span.start_time_unix_nano, "end_ns": span.end_time_unix_nano,
                    "scope": scope.scope.name,
                    "attributes": {a.key: _value(a.value) for a in span.attributes},
                })
    return spans


def json_attribute(span: dict[str, Any], key: str) -> Any:
    """A Langfuse attribute that holds JSON text, decoded (None when absent)."""
    value = span["attributes"].get(key)
    return json.loads(value) if isinstance(value, str) else value


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, kind) if kind else None
