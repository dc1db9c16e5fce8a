"""dex_ha.client — the Client SDK.

:class:`Connection` reaches the active node of a cluster over HTTP and follows it across
failovers (the Worker SDK uses it too); :class:`DexClient` wraps every client route;
:class:`StreamText` keeps the live text of each model step from ``DexClient.events()``,
without the text of failed attempts.
"""

from dex_ha.client.client import DexClient, IdleTimeoutError, SessionEvent
from dex_ha.client.connection import Connection, DexError, DexUnavailable
from dex_ha.client.stream_text import StreamText

__all__ = ["Connection", "DexClient", "DexError", "DexUnavailable", "IdleTimeoutError", "SessionEvent",
           "StreamText"]
