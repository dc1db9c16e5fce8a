"""dex_ha.client — the Client SDK.

:class:`Connection` reaches the active node of a cluster over HTTP and follows it across
failovers (the Worker SDK uses it too); :class:`DexClient` wraps every client route;
:class:`StreamText` keeps the live text of each model step from ``DexClient.events()``,
without the text of failed attempts; :class:`SessionEvent` is one event of that stream and
:class:`EventType` names every type of event. The session calls return typed results
(:class:`Session`, :class:`SessionPage`, :class:`MessageAccepted`, :class:`ClusterView`),
each with ``.raw``, the JSON the server sent.
"""

from dex_ha.client.client import DexClient, IdleTimeoutError
from dex_ha.client.connection import Connection, DexError, DexUnavailable
from dex_ha.client.results import (
    Attempt,
    ClusterView,
    MalformedAnswer,
    Member,
    MessageAccepted,
    PendingApproval,
    PendingQuestion,
    Session,
    SessionPage,
    SessionSummary,
    Step,
    ToolCallRecord,
    Turn,
)
from dex_ha.client.stream_text import StreamText
from dex_ha.session_protocol import EventType, SessionEvent

__all__ = [
    "Attempt",
    "ClusterView",
    "Connection",
    "DexClient",
    "DexError",
    "DexUnavailable",
    "EventType",
    "IdleTimeoutError",
    "MalformedAnswer",
    "Member",
    "MessageAccepted",
    "PendingApproval",
    "PendingQuestion",
    "Session",
    "SessionEvent",
    "SessionPage",
    "SessionSummary",
    "Step",
    "StreamText",
    "ToolCallRecord",
    "Turn",
]
