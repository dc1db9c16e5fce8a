"""The attempt's trace context, continued in the Worker (when opentelemetry-api is installed).

A task carries the W3C `traceparent` of its attempt's span when the server exports traces.
The Worker SDK runs the tool or model call inside a context continued from it, so the spans
the call starts itself (an instrumented HTTP client, the OpenAI SDK's) become children of
the attempt in the turn's trace. Without opentelemetry-api, or without a traceparent, the
call runs as it always did.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

try:  # optional: the otel extra, or any install of opentelemetry-api
    from opentelemetry import context as otel_context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _PROPAGATOR: TraceContextTextMapPropagator | None = TraceContextTextMapPropagator()
except ImportError:  # pragma: no cover - exercised where opentelemetry-api is not installed
    _PROPAGATOR = None


# Reused for every task without a trace context: entering it costs next to nothing.
_NO_CONTEXT: contextlib.AbstractContextManager[None] = contextlib.nullcontext()


def continued_from(traceparent: str | None) -> contextlib.AbstractContextManager[None]:
    """A context manager: its body runs with the current OpenTelemetry context continued
    from `traceparent` (nothing changes without one, or without opentelemetry-api)."""
    if traceparent is None or _PROPAGATOR is None:
        return _NO_CONTEXT
    return _attached(traceparent)


@contextlib.contextmanager
def _attached(traceparent: str) -> Iterator[None]:
    assert _PROPAGATOR is not None
    token = otel_context.attach(_PROPAGATOR.extract({"traceparent": traceparent}))
    try:
        yield
    finally:
        otel_context.detach(token)
