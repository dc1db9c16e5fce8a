"""RaftTransport over loopback: ordering, reconnects, snapshots, bad peers, authentication, TLS."""

from __future__ import annotations

import asyncio
import logging
import os
import struct
from collections.abc import AsyncIterator

import msgpack
import pytest

from dex_ha.raft.transport import FrameDecoder, FrameTooLarge, RaftTransport, pack_frame
from dex_ha.raft.types import ConfState, Message, MessageType, SnapshotMeta, encode_message
from harness.waiting import eventually
from tests.raft.transport_helpers import (
    DEADLINE,
    KIND_AUTH_OK,
    KIND_CHUNK,
    KIND_HELLO,
    LOOPBACK,
    PROTOCOL_VERSION,
    RAW_WHO,
    SECRET,
    Node,
    RawPeer,
    app,
    connect_all,
    frame,
    mac,
    make_certs,
    make_node,
)

LOGGER = "dex_ha.raft.transport"


async def started(*nodes: Node) -> tuple[Node, ...]:
    for n in nodes:
        await n.transport.start()
    await connect_all(*nodes)
    return nodes


@pytest.fixture
async def pair() -> AsyncIterator[tuple[Node, Node]]:
    """Two authenticated nodes, a and b, talking to each other."""
    a, b = await started(make_node("a", secret=SECRET), make_node("b", secret=SECRET))
    yield a, b
    await a.transport.stop()
    await b.transport.stop()


async def still_talking(a: Node, b: Node) -> None:
    """The good pair keeps exchanging messages both ways."""
    a.transport.send(app("a", "b", 7001))
    b.transport.send(app("b", "a", 7002))
    assert (await b.recv()).index == 7001
    assert (await a.recv()).index == 7002


# ---------------------------------------------------------------------------- normal traffic


async def test_messages_flow_both_ways_in_order(pair: tuple[Node, Node]) -> None:
    a, b = pair
    to_b = [app("a", "b", i) for i in range(500)]
    to_a = [app("b", "a", i) for i in range(500)]
    for x, y in zip(to_b, to_a):
        a.transport.send(x)
        b.transport.send(y)
    assert await b.recv_n(500) == to_b
    assert await a.recv_n(500) == to_a
    assert a.transport.stats.frames_sent >= 500 and b.transport.stats.frames_received >= 500
    assert a.transport.stats.writes < a.transport.stats.frames_sent / 5  # batched writes


async def test_reconnect_after_the_peer_restarts(pair: tuple[Node, Node]) -> None:
    a, b = pair
    a.transport.send(app("a", "b", 1))
    assert (await b.recv()).index == 1
    port = b.port
    await b.transport.stop()
    await eventually(
        lambda: "b" in a.unreachable or a.transport.stats.connect_failures > 0 or _send_and_count_drop(a),
        deadline_s=DEADLINE,
    )
    b2 = make_node("b", port=port, secret=SECRET)
    await b2.transport.start()
    b2.transport.set_peers({"a": a.addr})
    try:
        got = await asyncio.wait_for(_send_until_delivered(a, b2, poll_s=0.2), 10)
        assert got.frm == "a"
        later = [app("a", "b", 10_000 + i) for i in range(20)]
        for m in later:
            a.transport.send(m)
        received: list[Message] = []
        while len(received) < 20:
            m = await b2.recv()
            if m.index >= 10_000:
                received.append(m)
        assert received == later
        b2.transport.send(app("b", "a", 5))
        assert (await a.recv()).index == 5
    finally:
        await b2.transport.stop()


async def _send_until_delivered(sender: Node, receiver: Node, poll_s: float) -> Message:
    """Send from `sender` until `receiver` gets one: messages sent while the link is down
    are lost, by design. Callers put a deadline around it."""
    i = 100
    while True:
        sender.transport.send(app(sender.id, receiver.id, i))
        i += 1
        try:
            return await asyncio.wait_for(receiver.inbox.get(), poll_s)
        except TimeoutError:
            continue


def _send_and_count_drop(a: Node) -> bool:
    a.transport.send(app("a", "b", 2))
    return a.transport.stats.messages_dropped > 0


async def test_messages_are_dropped_and_reported_when_a_peer_is_down() -> None:
    a = make_node("a", secret=SECRET, max_queue_messages=8)
    await a.transport.start()
    dead = make_node("dead")
    await dead.transport.start()
    port = dead.port
    await dead.transport.stop()  # nothing listens there now
    a.transport.set_peers({"b": (LOOPBACK, port)})
    try:
        for i in range(100):
            a.transport.send(app("a", "b", i))
        await eventually(lambda: a.transport.stats.messages_dropped >= 90 and "b" in a.unreachable, deadline_s=DEADLINE)
        a.transport.send(Message(MessageType.SNAP, "b", "a", data=b"s" * 10))
        await eventually(lambda: ("b", False) in a.snapshots_sent, deadline_s=DEADLINE)
    finally:
        await a.transport.stop()


async def test_while_unreachable_send_drops_at_once() -> None:
    """After a failed dial the peer is unreachable: send() drops and reports immediately
    instead of queueing stale messages for a later connection."""
    a = make_node("a", secret=SECRET)  # a large queue: drops cannot come from a full one
    await a.transport.start()
    dead = make_node("dead")
    await dead.transport.start()
    port = dead.port
    await dead.transport.stop()
    a.transport.set_peers({"b": (LOOPBACK, port)})
    try:
        await eventually(lambda: a.transport.stats.connect_failures > 0, deadline_s=DEADLINE)

        def dropped_synchronously() -> bool:
            before = a.transport.stats.messages_dropped
            a.transport.send(app("a", "b", 1))
            return a.transport.stats.messages_dropped > before

        await eventually(dropped_synchronously, deadline_s=DEADLINE)
        await eventually(lambda: "b" in a.unreachable, deadline_s=DEADLINE)
    finally:
        await a.transport.stop()


async def test_a_peer_that_keeps_dropping_us_is_not_redialed_in_a_hot_loop() -> None:
    accepted = 0

    async def flaky(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        accepted += 1
        peer = RawPeer(reader, writer)
        challenge = os.urandom(32)
        writer.write(frame(KIND_HELLO, msgpack.packb(["dex-ha-raft", 1, challenge], use_bin_type=True)))
        kind, body = await peer.read_frame()
        _, theirs, _, _ = msgpack.unpackb(body)
        answer = ["b", mac(SECRET, "acceptor", theirs, "b"), RAW_WHO]
        writer.write(frame(KIND_AUTH_OK, msgpack.packb(answer, use_bin_type=True)))
        await writer.drain()
        writer.close()  # authenticated, then gone

    server = await asyncio.start_server(flaky, LOOPBACK, 0)
    a = make_node("a", secret=SECRET)
    await a.transport.start()
    a.transport.set_peers({"b": (LOOPBACK, server.sockets[0].getsockname()[1])})
    try:
        await eventually(lambda: accepted >= 1, deadline_s=DEADLINE)
        await asyncio.sleep(1.0)  # a measurement window, not a wait for a condition
        assert accepted < 20  # exponential backoff: about 5 dials in a second, not thousands
    finally:
        await a.transport.stop()
        server.close()
        await server.wait_closed()


async def test_messages_to_unknown_peers_are_dropped(pair: tuple[Node, Node]) -> None:
    a, _ = pair
    a.transport.send(app("a", "zz", 1))
    assert a.transport.stats.messages_dropped == 1


async def test_set_peers_adds_and_removes_peers(pair: tuple[Node, Node]) -> None:
    a, b = pair
    c = make_node("c", secret=SECRET)
    await c.transport.start()
    try:
        a.transport.set_peers({"b": b.addr, "c": c.addr})
        a.transport.send(app("a", "c", 1))
        assert (await c.recv()).index == 1
        a.transport.set_peers({"c": c.addr})
        a.transport.send(app("a", "b", 2))
        assert a.transport.stats.messages_dropped == 1  # b is no longer a peer
        a.transport.send(app("a", "c", 3))
        assert (await c.recv()).index == 3
    finally:
        await c.transport.stop()


async def test_stop_leaves_no_task_behind(pair: tuple[Node, Node]) -> None:
    a, b = pair
    await still_talking(a, b)
    await a.transport.stop()
    await b.transport.stop()
    await asyncio.sleep(0)
    assert asyncio.all_tasks() == {asyncio.current_task()}


# ---------------------------------------------------------------------------- snapshots


SNAP_META = SnapshotMeta(index=1234, term=7, conf_state=ConfState(voters=("a", "b", "c")))


async def test_a_10_mib_snapshot_arrives_whole_in_chunks() -> None:
    a, b = await started(
        make_node("a", secret=SECRET, max_frame_bytes=2 << 20), make_node("b", secret=SECRET, max_frame_bytes=2 << 20)
    )
    try:
        data = os.urandom(10 << 20)  # 10 MiB: five times the frame limit
        snap = Message(MessageType.SNAP, "b", "a", term=7, snapshot=SNAP_META, data=data)
        a.transport.send(snap)
        a.transport.send(Message(MessageType.HEARTBEAT, "b", "a", term=7))
        got = [await b.recv(), await b.recv()]
        (received,) = [m for m in got if m.type == MessageType.SNAP]
        assert received == snap
        assert b.transport.stats.frames_received >= 11  # ten 1 MiB chunks and the heartbeat
        assert b.transport.stats.snapshots_received == 1
        await eventually(lambda: a.snapshots_sent == [("b", True)], deadline_s=DEADLINE)
        await still_talking(a, b)
    finally:
        await a.transport.stop()
        await b.transport.stop()


async def test_a_snapshot_above_the_receivers_limit_drops_the_connection(caplog) -> None:
    a, b = await started(make_node("a", secret=SECRET), make_node("b", secret=SECRET, max_snapshot_bytes=1 << 20))
    try:
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            a.transport.send(Message(MessageType.SNAP, "b", "a", snapshot=SNAP_META, data=b"x" * (2 << 20)))
            await eventually(lambda: "exceeds the limit" in caplog.text, deadline_s=DEADLINE)
        assert b.inbox.empty()
        # The link comes back for normal traffic. A message that a queues before it notices
        # the drop is lost with the connection (by design), so send until one gets through.
        assert (await asyncio.wait_for(_send_until_delivered(a, b, poll_s=0.2), 10)).frm == "a"
    finally:
        await a.transport.stop()
        await b.transport.stop()


@pytest.mark.parametrize("second_offset", [7, 3, 0])
async def test_a_snapshot_chunk_that_does_not_continue_drops_the_connection(
    pair: tuple[Node, Node], caplog, second_offset: int
) -> None:
    a, b = pair
    raw = await RawPeer.connect(b.port)
    await raw.handshake("a", SECRET)
    header = encode_message(Message(MessageType.SNAP, "b", "a", snapshot=SNAP_META))
    raw.send_frame(KIND_CHUNK, msgpack.packb([0, 10, False, header, b"01234"], use_bin_type=True))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        # A gap, an overlap, or a restart without a header: all break the transfer.
        raw.send_frame(KIND_CHUNK, msgpack.packb([second_offset, 10, True, None, b"56789"], use_bin_type=True))
        assert await raw.closed_by_peer()
    assert "snapshot" in caplog.text and "dropped" in caplog.text
    assert b.inbox.empty()
    await still_talking(a, b)


async def test_a_snapshot_in_raw_chunks_is_reassembled(pair: tuple[Node, Node]) -> None:
    """The control for the test above: the same chunks in order deliver the snapshot."""
    _, b = pair
    raw = await RawPeer.connect(b.port)
    await raw.handshake("a", SECRET)
    header = encode_message(Message(MessageType.SNAP, "b", "a", snapshot=SNAP_META))
    raw.send_frame(KIND_CHUNK, msgpack.packb([0, 10, False, header, b"01234"], use_bin_type=True))
    raw.send_frame(KIND_CHUNK, msgpack.packb([5, 10, True, None, b"56789"], use_bin_type=True))
    got = await b.recv()
    assert (got.type, got.snapshot, got.data) == (MessageType.SNAP, SNAP_META, b"0123456789")
    raw.close()


# ---------------------------------------------------------------------------- bad peers


async def test_a_peer_without_the_secret_is_refused_and_logged(pair: tuple[Node, Node], caplog) -> None:
    a, b = pair
    raw = await RawPeer.connect(b.port)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        await raw.handshake("mallory", None)  # no MAC at all
        assert await raw.closed_by_peer()
        await eventually(lambda: raw.local_addr in caplog.text, deadline_s=DEADLINE)
    assert "rejected" in caplog.text
    assert b.transport.stats.connections_rejected == 1
    await still_talking(a, b)


async def test_a_wrong_hmac_is_refused_even_with_a_real_node_id(pair: tuple[Node, Node], caplog) -> None:
    a, b = pair
    raw = await RawPeer.connect(b.port)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        await raw.handshake("a", b"not-the-cluster-secret")
        assert await raw.closed_by_peer()
        await eventually(lambda: raw.local_addr in caplog.text, deadline_s=DEADLINE)
    raw2 = await RawPeer.connect(b.port)
    await raw2.handshake("a", None, mac_override=b"\0" * 32)
    assert await raw2.closed_by_peer()
    assert b.transport.stats.connections_rejected == 2 and b.inbox.empty()
    await still_talking(a, b)


async def test_a_good_raw_peer_is_accepted_and_the_acceptor_proves_itself(pair: tuple[Node, Node]) -> None:
    """The control for the tests above: the same raw peer with the secret gets through."""
    _, b = pair
    raw = await RawPeer.connect(b.port)
    await raw.handshake("a", SECRET)
    await raw.expect_auth_ok("b", SECRET)
    raw.send_message(app("a", "b", 42))
    assert (await b.recv()).index == 42
    raw.close()


async def test_the_dialer_refuses_an_impostor_acceptor(caplog) -> None:
    """Mutual: a node will not send to a listener that cannot prove it holds the secret,
    even one that accepts anything and answers with the right node id."""
    got_messages: list[bytes] = []

    async def impostor(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(
            frame(KIND_HELLO, msgpack.packb(["dex-ha-raft", PROTOCOL_VERSION, os.urandom(32)], use_bin_type=True))
        )
        await reader.readexactly(struct.unpack(">I", await reader.readexactly(4))[0])  # AUTH, unchecked
        writer.write(
            frame(
                KIND_AUTH_OK,
                msgpack.packb(
                    ["b", mac(b"guessed-secret-123", "acceptor", b"?" * 32, "b"), RAW_WHO], use_bin_type=True
                ),
            )
        )
        got_messages.append(await reader.read(65536))  # anything the dialer sends next
        writer.close()

    server = await asyncio.start_server(impostor, LOOPBACK, 0)
    a = make_node("a", secret=SECRET)
    await a.transport.start()
    a.transport.set_peers({"b": (LOOPBACK, server.sockets[0].getsockname()[1])})
    try:
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            a.transport.send(app("a", "b", 1))
            await eventually(lambda: a.transport.stats.connect_failures > 0 and got_messages, deadline_s=DEADLINE)
        assert got_messages[0] == b""  # it hung up without sending a frame
        assert "bad or missing authentication" in caplog.text
    finally:
        await a.transport.stop()
        server.close()
        await server.wait_closed()


async def test_a_silent_peer_times_out(caplog) -> None:
    b = make_node("b", secret=SECRET, handshake_timeout=0.3)
    await b.transport.start()
    try:
        raw = await RawPeer.connect(b.port)
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            assert await raw.closed_by_peer()  # it never answers the HELLO
        assert "timed out" in caplog.text and raw.local_addr in caplog.text
    finally:
        await b.transport.stop()


async def test_garbage_before_authentication_is_refused(pair: tuple[Node, Node], caplog) -> None:
    a, b = pair
    raw = await RawPeer.connect(b.port)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        raw.send_raw(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert await raw.closed_by_peer()
        await eventually(lambda: raw.local_addr in caplog.text, deadline_s=DEADLINE)
    await still_talking(a, b)


async def test_garbage_after_authentication_drops_the_connection(pair: tuple[Node, Node], caplog) -> None:
    a, b = pair
    raw = await RawPeer.connect(b.port)
    await raw.handshake("a", SECRET)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        raw.send_frame(1, b"\xc1\xc1 definitely not msgpack")
        assert await raw.closed_by_peer()
        await eventually(lambda: "MalformedMessage" in caplog.text, deadline_s=DEADLINE)
    assert b.transport.stats.connections_dropped == 1
    await still_talking(a, b)


async def test_an_oversized_length_prefix_drops_the_connection_without_buffering(caplog) -> None:
    a, b = await started(make_node("a", secret=SECRET), make_node("b", secret=SECRET, max_frame_bytes=2 << 20))
    try:
        raw = await RawPeer.connect(b.port)
        await raw.handshake("a", SECRET)
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            raw.send_raw(struct.pack(">I", 3 << 30))  # announces 3 GiB, sends nothing more
            assert await raw.closed_by_peer()  # closed on the prefix alone
            await eventually(lambda: "FrameTooLarge" in caplog.text, deadline_s=DEADLINE)
        assert "3221225472" in caplog.text
        await still_talking(a, b)
    finally:
        await a.transport.stop()
        await b.transport.stop()


async def test_valid_msgpack_that_is_not_a_message_is_dropped(pair: tuple[Node, Node], caplog) -> None:
    a, b = pair
    raw = await RawPeer.connect(b.port)
    await raw.handshake("a", SECRET)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        raw.send_frame(1, msgpack.packb({"type": "APP", "to": "b"}))
        assert await raw.closed_by_peer()
        await eventually(lambda: "MalformedMessage" in caplog.text, deadline_s=DEADLINE)
    assert b.inbox.empty()
    await still_talking(a, b)


async def test_an_unknown_frame_kind_is_dropped(pair: tuple[Node, Node], caplog) -> None:
    a, b = pair
    raw = await RawPeer.connect(b.port)
    await raw.handshake("a", SECRET)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        raw.send_frame(99, b"hello")
        assert await raw.closed_by_peer()
    assert "unexpected frame kind 99" in caplog.text
    await still_talking(a, b)


async def test_a_peer_claiming_another_frm_is_dropped(pair: tuple[Node, Node], caplog) -> None:
    a, b = pair
    raw = await RawPeer.connect(b.port)
    await raw.handshake("c", SECRET)  # a real member, authenticated as c ...
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        raw.send_message(app("c", "b", 1))  # ... may speak as c
        assert (await b.recv()).frm == "c"
        raw.send_message(app("a", "b", 2))  # ... but not as a
        assert await raw.closed_by_peer()
    assert "claims to be from 'a'" in caplog.text
    assert b.inbox.empty()
    await still_talking(a, b)


async def test_a_message_for_another_node_is_dropped_not_delivered(pair: tuple[Node, Node], caplog) -> None:
    a, b = pair
    raw = await RawPeer.connect(b.port)
    await raw.handshake("a", SECRET)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        raw.send_message(app("a", "zz", 1))
        raw.send_message(app("a", "b", 2))
        assert (await b.recv()).index == 2
    assert "addressed to 'zz'" in caplog.text


async def test_insecure_mode_talks_without_a_secret() -> None:
    a, b = await started(make_node("a"), make_node("b"))
    try:
        await still_talking(a, b)
    finally:
        await a.transport.stop()
        await b.transport.stop()


async def test_a_node_with_a_secret_refuses_an_insecure_one(caplog) -> None:
    a, b = await started(make_node("a"), make_node("b", secret=SECRET))
    try:
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            a.transport.send(app("a", "b", 1))
            await eventually(lambda: b.transport.stats.connections_rejected > 0, deadline_s=DEADLINE)
        b.transport.send(app("b", "a", 2))
        await eventually(lambda: b.transport.stats.connect_failures > 0, deadline_s=DEADLINE)  # a cannot prove itself
        assert a.inbox.empty() and b.inbox.empty()
    finally:
        await a.transport.stop()
        await b.transport.stop()


# ---------------------------------------------------------------------------- mutual TLS


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    pytest.importorskip("cryptography")
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.mark.parametrize("secret", [None, SECRET], ids=["tls-only", "tls-and-secret"])
async def test_mutual_tls_carries_messages(certs, secret: bytes | None) -> None:
    def node(nid: str) -> Node:
        return make_node(
            nid,
            secret=secret,
            ssl_server=certs.server_ctx(),
            ssl_client=certs.client_ctx(certs.node_cert, certs.node_key),
        )

    a, b = await started(node("a"), node("b"))
    try:
        await still_talking(a, b)
        a.transport.send(Message(MessageType.SNAP, "b", "a", snapshot=SNAP_META, data=os.urandom(3 << 20)))
        assert len((await b.recv()).data) == 3 << 20
    finally:
        await a.transport.stop()
        await b.transport.stop()


@pytest.mark.parametrize("client_cert", ["none", "other-ca"])
async def test_mutual_tls_refuses_a_client_without_a_valid_certificate(certs, caplog, client_cert: str) -> None:
    b = make_node("b", ssl_server=certs.server_ctx(), ssl_client=certs.client_ctx(certs.node_cert, certs.node_key))
    await b.transport.start()
    try:
        ctx = certs.client_ctx() if client_cert == "none" else certs.client_ctx(certs.rogue_cert, certs.rogue_key)
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            try:
                raw = await RawPeer.connect(b.port, ssl_ctx=ctx)
            except ssl_errors():
                raw = None  # refused during the TLS handshake itself
            if raw is not None:
                with pytest.raises((asyncio.IncompleteReadError, *ssl_errors())):
                    await raw.read_frame()  # no HELLO for it: the server hung up
            await eventually(lambda: "rejected" in caplog.text, deadline_s=DEADLINE)
        assert b.transport.stats.connections_rejected == 1 and b.inbox.empty()
    finally:
        await b.transport.stop()


def ssl_errors() -> tuple[type[BaseException], ...]:
    import ssl

    return (ssl.SSLError, ConnectionError)


# ---------------------------------------------------------------------------- units


def test_frame_decoder_reassembles_byte_by_byte_and_rejects_oversize_at_once() -> None:
    frames = [pack_frame(1, b"x" * n) for n in (0, 1, 300, 70000)]
    dec = FrameDecoder(max_frame_bytes=100_000)
    out = []
    for byte in b"".join(frames):
        out += dec.feed(bytes([byte]))
    assert out == [f[4:] for f in frames]
    dec = FrameDecoder(max_frame_bytes=1000)
    with pytest.raises(FrameTooLarge):
        dec.feed(struct.pack(">I", 1001))  # just the prefix: no body needed to refuse it


def test_configuration_is_validated() -> None:
    with pytest.raises(ValueError, match="both"):
        RaftTransport("a", (LOOPBACK, 0), {}, print, ssl_server=None, ssl_client=object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="chunk"):
        RaftTransport("a", (LOOPBACK, 0), {}, print, max_frame_bytes=1 << 20, snapshot_chunk_bytes=1 << 20)
    with pytest.raises(ValueError, match="secret"):
        RaftTransport("a", (LOOPBACK, 0), {}, print, secret=b"short")


def test_log_budget_allows_a_burst_per_window_and_reports_what_it_held_back() -> None:
    from dex_ha.raft.transport import LogBudget

    budget = LogBudget(burst=3, window_s=10.0)
    first = [budget.take(0.0) for _ in range(5)]
    assert first == [(True, 0)] * 3 + [(False, 0)] * 2
    assert budget.take(5.0) == (False, 0)  # same window
    assert budget.take(10.0) == (True, 3)  # next window: the three held back are reported
    assert budget.take(10.1) == (True, 0)


async def test_a_flood_of_bad_connections_is_counted_but_not_all_logged(pair: tuple[Node, Node], caplog) -> None:
    from dex_ha.raft.transport import REJECTION_LOG_BURST

    a, b = pair
    flood = REJECTION_LOG_BURST * 3
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for _ in range(flood):
            raw = await RawPeer.connect(b.port)
            raw.send_raw(b"GET / HTTP/1.1\r\n\r\n")
            assert await raw.closed_by_peer()
        await eventually(lambda: b.transport.stats.connections_rejected >= flood, deadline_s=DEADLINE)
    lines = [r for r in caplog.records if "rejected:" in r.getMessage()]
    assert len(lines) == REJECTION_LOG_BURST
    await still_talking(a, b)


async def test_a_peer_that_dials_us_ends_our_backoff_towards_it(pair: tuple[Node, Node]) -> None:
    """After a long outage our redial backoff is seconds long; when the restarted peer
    connects to us, we redial at once, so our next message (a vote request) gets through."""
    import time

    from dex_ha.raft.transport import BACKOFF_MAX_S

    a, b = pair
    a.transport.send(app("a", "b", 1))
    assert (await b.recv()).index == 1
    port = b.port
    await b.transport.stop()
    # Let a's backoff grow to its maximum: keep failing to dial b for a while.
    t0 = time.monotonic()
    while time.monotonic() - t0 < 2 * BACKOFF_MAX_S:
        a.transport.send(app("a", "b", 1))
        await asyncio.sleep(0.05)
    assert a.transport.stats.connect_failures >= 3
    b2 = make_node("b", port=port, secret=SECRET)
    await b2.transport.start()
    b2.transport.set_peers({"a": a.addr})
    try:
        b2.transport.send(app("b", "a", 7))  # b dials a
        assert (await a.recv()).index == 7
        start = time.monotonic()
        await asyncio.wait_for(_send_until_delivered(a, b2, poll_s=0.02), 10)
        took = time.monotonic() - start
        assert took < BACKOFF_MAX_S / 4, f"a waited {took:.2f}s to redial b after b dialed a"
    finally:
        await b2.transport.stop()
