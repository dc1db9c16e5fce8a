"""A local OTLP/HTTP trace receiver for tests and benches: an aiohttp server on 127.0.0.1
that accepts `POST /v1/traces` (application/x-protobuf), decodes each request with
opentelemetry-proto and keeps the spans, flattened into `ReceivedSpan`s. With
`keep_spans=False` it only counts the requests and their bytes (a bench's collector that
must cost the bench's process as little as it can)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from harness.ports import free_ports

PROTOBUF = "application/x-protobuf"


@dataclass
class ReceivedSpan:
    name: str
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_id: str  # "" for a root span
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    status: int  # 0 unset, 1 ok, 2 error
    start_ns: int = 0
    resource: dict[str, Any] = field(default_factory=dict)
    scope: str = ""


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return None if kind is None else getattr(value, kind)


def _attributes(pairs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs if isinstance(kv, KeyValue)}


class OtlpReceiver:
    """Start with `await start()`; `spans` grows as exports arrive; `await stop()`."""

    def __init__(self, keep_spans: bool = True) -> None:
        self.port = free_ports(1)[0]
        self.url = f"http://127.0.0.1:{self.port}"
        self.keep_spans = keep_spans
        self.spans: list[ReceivedSpan] = []
        self.requests = 0  # exports accepted
        self.bytes_received = 0
        self.bad_requests: list[str] = []
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _traces(self, request: web.Request) -> web.Response:
        if request.content_type != PROTOBUF:
            self.bad_requests.append(request.content_type)
            return web.Response(status=415, text=f"expected {PROTOBUF}")
        body = await request.read()
        self.requests += 1
        self.bytes_received += len(body)
        if self.keep_spans:
            self._keep(body)
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(), content_type=PROTOBUF)

    def _keep(self, body: bytes) -> None:
        message = ExportTraceServiceRequest()
        message.ParseFromString(body)
        for resource_spans in message.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    self.spans.append(
                        ReceivedSpan(
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex(),
                            attributes=_attributes(span.attributes),
                            events=[(e.name, _attributes(e.attributes)) for e in span.events],
                            status=span.status.code,
                            start_ns=span.start_time_unix_nano,
                            resource=resource,
                            scope=scope_spans.scope.name,
                        )
                    )

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        return [s for s in self.spans if s.trace_id == trace_id]
