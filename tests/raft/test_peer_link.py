"""The peer link authenticates every frame, not only the handshake.

A relay in the middle (transport_helpers.Relay) does not know the cluster secret. It
forwards a real handshake, then injects, replays or reorders frames: each must be refused,
drop the connection and be logged, and the link must then reconnect and carry messages.
Also: the handshake itself (a short or replayed answer), the key derivation, insecure
mode (no MAC there; mutual TLS with a secret, also without one, is in test_transport.py),
and a transport without a listener.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import os
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TypedDict

import msgpack
import pytest

from dex_ha.raft.node import Member, NodeConfig, RaftNode
from dex_ha.raft.types import Message, MessageType, encode_message
from harness.kv_node import KVStateMachine
from harness.ports import free_ports
from harness.waiting import eventually
from tests.raft.node_config import node_config
from tests.raft.transport_helpers import (
    DEADLINE,
    KIND_HELLO,
    KIND_MESSAGE,
    LOOPBACK,
    RAW_WHO,
    SECRET,
    Node,
    RawPeer,
    Relay,
    RelayConnection,
    Tamper,
    app,
    frame,
    mac,
    make_node,
    read_whole_frame,
)

LOGGER = "dex_ha.raft.transport"
TAG_BYTES = 16


def forged_heartbeat(conn: RelayConnection, to: str, term: int = 999) -> bytes:
    """A well-formed HEARTBEAT in the name of the connection's authenticated dialer."""
    return frame(KIND_MESSAGE, encode_message(Message(MessageType.HEARTBEAT, to, conn.dialer_id, term=term)))


@contextlib.asynccontextmanager
async def relayed(tamper: Tamper) -> AsyncIterator[tuple[Node, Node, Relay]]:
    """Nodes a and b with the cluster secret; a reaches b only through the relay."""
    a, b = make_node("a", secret=SECRET), make_node("b", secret=SECRET)
    await a.transport.start()
    await b.transport.start()
    relay = Relay(b.port, tamper)
    port = await relay.start()
    a.transport.set_peers({"b": (LOOPBACK, port)})
    b.transport.set_peers({"a": a.addr})
    try:
        yield a, b, relay
    finally:
        await a.transport.stop()
        await b.transport.stop()
        await relay.stop()


async def received_until_the_link_works(a: Node, b: Node) -> list[Message]:
    """What b receives until a message that a sends now gets through (the link may have to
    reconnect first: messages sent meanwhile are lost, by design). The last one is that
    message, its index ≥ 1000."""
    got: list[Message] = []

    async def run() -> None:
        i = 1000
        while not got or got[-1].index < 1000:
            a.transport.send(app("a", "b", i))
            i += 1
            with contextlib.suppress(TimeoutError):
                got.append(await asyncio.wait_for(b.inbox.get(), 0.2))
                while not b.inbox.empty() and got[-1].index < 1000:
                    got.append(b.inbox.get_nowait())

    await asyncio.wait_for(run(), DEADLINE)
    return got


def describe(messages: list[Message]) -> list[tuple[str, int, int]]:
    return [(m.type.name, m.term, m.index) for m in messages]


async def assert_refused_for_its_mac(b: Node, relay: Relay, conn_number: int, caplog) -> None:
    """b, not the relay or a, closed that connection, counted it and said why."""
    await eventually(
        lambda: len(relay.connections) > conn_number and relay.connections[conn_number].closed_by_acceptor,
        deadline_s=DEADLINE,
    )
    assert b.transport.stats.frames_unauthenticated == 1
    assert b.transport.stats.connections_dropped == 1
    assert "fails its MAC" in caplog.text


# ---------------------------------------------------------------------------- the repro


@pytest.mark.parametrize("tag", ["none", "random", "of-the-displaced-frame"])
async def test_a_frame_injected_after_the_handshake_is_refused(caplog, tag: str) -> None:
    """The repro: a relay forwards the handshake unchanged, then injects a HEARTBEAT with
    term 999 in the name of the authenticated dialer. Before every frame carried a MAC, b
    delivered it."""

    def inject(conn: RelayConnection, n: int, f: bytes) -> list[bytes]:
        if conn.number != 0 or n != 1:
            return [f]
        forged = forged_heartbeat(conn, "b")
        if tag == "random":  # a frame of the new format with a guessed MAC
            forged = struct.pack(">I", len(forged) - 4 + TAG_BYTES) + forged[4:] + os.urandom(TAG_BYTES)
        elif tag == "of-the-displaced-frame":  # the valid MAC of frame 1 (sequence number 0)
            forged = struct.pack(">I", len(forged) - 4 + TAG_BYTES) + forged[4:] + f[-TAG_BYTES:]
        return [forged, f]

    async with relayed(inject) as (a, b, relay):
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            a.transport.send(app("a", "b", 1))  # frame 1: the relay puts the forged one before it
            got = await received_until_the_link_works(a, b)
            assert describe(got[:-1]) == []  # neither the forgery nor what followed it
            await assert_refused_for_its_mac(b, relay, 0, caplog)
        assert len(relay.connections) >= 2  # a reconnected: the last message came that way


async def test_a_frame_replayed_on_the_same_connection_is_refused(caplog) -> None:
    def duplicate_frame_3(conn: RelayConnection, n: int, f: bytes) -> list[bytes]:
        return [f, f] if (conn.number, n) == (0, 3) else [f]

    async with relayed(duplicate_frame_3) as (a, b, relay):
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            for i in (1, 2, 3, 4):  # frames 1 to 4
                a.transport.send(app("a", "b", i))
            got = await received_until_the_link_works(a, b)
            # Without per-frame sequence numbers: 1, 2, 3, 3, 4.
            assert [m.index for m in got[:-1]] == [1, 2, 3]
            await assert_refused_for_its_mac(b, relay, 0, caplog)


async def test_two_frames_swapped_are_refused(caplog) -> None:
    held: list[bytes] = []

    def swap_frames_2_and_3(conn: RelayConnection, n: int, f: bytes) -> list[bytes]:
        if (conn.number, n) == (0, 2):
            held.append(f)
            return []
        if (conn.number, n) == (0, 3):
            return [f, held.pop()]
        return [f]

    async with relayed(swap_frames_2_and_3) as (a, b, relay):
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            for i in (1, 2, 3, 4):
                a.transport.send(app("a", "b", i))
            got = await received_until_the_link_works(a, b)
            assert [m.index for m in got[:-1]] == [1]  # without the MAC: 1, 3, 2, 4
            await assert_refused_for_its_mac(b, relay, 0, caplog)


async def test_a_frame_replayed_on_a_later_connection_is_refused(caplog) -> None:
    """Same position (the first data frame, sequence number 0), but a new connection:
    the new challenges give a new key, so the recorded MAC no longer fits."""
    recorded: list[bytes] = []

    def record_then_replay(conn: RelayConnection, n: int, f: bytes) -> list[bytes]:
        if (conn.number, n) == (0, 1):
            recorded.append(f)
            asyncio.get_running_loop().call_soon(conn.cut)  # after forwarding it
        if (conn.number, n) == (1, 1):
            return [recorded[0], f]
        return [f]

    async with relayed(record_then_replay) as (a, b, relay):
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            a.transport.send(app("a", "b", 1))
            assert (await b.recv()).index == 1
            await eventually(lambda: relay.connections[0].cut_by_relay, deadline_s=DEADLINE)
            got = await received_until_the_link_works(a, b)
            assert describe(got[:-1]) == []  # without the MAC: message 1 a second time
            await assert_refused_for_its_mac(b, relay, 1, caplog)


async def test_an_untouched_relay_changes_nothing() -> None:
    """The control for the tests above: the relay itself does not break the link."""
    async with relayed(lambda conn, n, f: [f]) as (a, b, relay):
        for i in (1, 2, 3, 4):
            a.transport.send(app("a", "b", i))
        assert [m.index for m in await b.recv_n(4)] == [1, 2, 3, 4]
        assert len(relay.connections) == 1 and b.transport.stats.connections_dropped == 0


async def test_a_flood_of_forged_frames_is_counted_but_not_all_logged(caplog) -> None:
    """Whoever can inject into the stream can make b drop connections as often as it likes:
    the drops are counted, their log lines capped per window (LogBudget)."""
    from dex_ha.raft.transport import REJECTION_LOG_BURST

    b = make_node("b", secret=SECRET)
    await b.transport.start()
    flood = REJECTION_LOG_BURST * 3
    try:
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            for i in range(flood):
                raw = await RawPeer.connect(b.port)
                await raw.handshake("a", SECRET)
                raw.send_raw(frame(KIND_MESSAGE, encode_message(app("a", "b", i))))  # no tag
                assert await raw.closed_by_peer()
            await eventually(lambda: b.transport.stats.frames_unauthenticated >= flood, deadline_s=DEADLINE)
        lines = [r for r in caplog.records if "fails its MAC" in r.getMessage()]
        assert len(lines) == REJECTION_LOG_BURST
        assert b.inbox.empty()
    finally:
        await b.transport.stop()


# ---------------------------------------------------------------------------- the repro, on Raft nodes


def _node_config(nid: str, root: Path, members: dict[str, Member], listen: tuple[str, int]) -> NodeConfig:
    return node_config(nid, root, members, raft_listen=listen, secret=SECRET)


async def test_a_forged_heartbeat_does_not_change_the_term_of_a_raft_node(tmp_path: Path, caplog) -> None:
    """Three Raft nodes; every connection to n2 runs through the relay. Armed, the relay
    injects a HEARTBEAT with term 999 into one of them: n2 keeps its term."""
    armed, injected = False, list[str]()

    def inject_once(conn: RelayConnection, n: int, f: bytes) -> list[bytes]:
        if armed and n >= 1 and not injected:
            injected.append(conn.dialer_id)
            return [forged_heartbeat(conn, "n2"), f]
        return [f]

    p1, p2, p3 = free_ports(3)
    relay = Relay(p2, inject_once)
    relay_port = await relay.start()
    members = {"n1": Member((LOOPBACK, p1)), "n2": Member((LOOPBACK, relay_port)), "n3": Member((LOOPBACK, p3))}
    nodes = {
        nid: RaftNode(_node_config(nid, tmp_path, members, (LOOPBACK, port)), KVStateMachine())
        for nid, port in (("n1", p1), ("n2", p2), ("n3", p3))
    }
    n2 = nodes["n2"]
    try:
        for node in nodes.values():
            await node.start()
        await eventually(
            lambda: any(n.is_leader and n.lease_valid() for n in nodes.values()) and n2.leader_id,
            "a leader with a lease that n2 knows",
            deadline_s=DEADLINE,
        )
        term = n2.core.term
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            armed = True
            await eventually(
                lambda: injected and (n2.transport.stats.connections_dropped or n2.core.term != term),
                "the forged heartbeat to arrive",
                deadline_s=DEADLINE,
            )
            assert n2.core.term == term, f"n2 moved to term {n2.core.term} on a forged heartbeat"
        assert n2.transport.stats.frames_unauthenticated == 1
        assert f"raft connection from {injected[0]}" in caplog.text and "fails its MAC" in caplog.text
    finally:
        for node in nodes.values():
            await node.stop()
        await relay.stop()


# ---------------------------------------------------------------------------- the handshake


@pytest.fixture
async def pair() -> AsyncIterator[tuple[Node, Node]]:
    a, b = make_node("a", secret=SECRET), make_node("b", secret=SECRET)
    await a.transport.start()
    await b.transport.start()
    a.transport.set_peers({"b": b.addr})
    b.transport.set_peers({"a": a.addr})
    yield a, b
    await a.transport.stop()
    await b.transport.stop()


@pytest.mark.parametrize("answer", ["empty", "short-zeros", "the-first-half-of-the-right-one"])
async def test_a_short_or_empty_handshake_mac_is_refused(pair: tuple[Node, Node], caplog, answer: str) -> None:
    """With a real node id. A check that compared only the bytes sent would take them."""
    _, b = pair
    raw = await RawPeer.connect(b.port)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        hello_kind, hello = await raw.read_frame()
        assert hello_kind == KIND_HELLO
        challenge = msgpack.unpackb(hello)[2]
        given = {
            "empty": b"",
            "short-zeros": b"\0" * 16,
            "the-first-half-of-the-right-one": mac(SECRET, "dialer", challenge, "a")[:16],
        }[answer]
        raw.send_raw(frame(17, msgpack.packb(["a", os.urandom(32), given, RAW_WHO], use_bin_type=True)))
        assert await raw.closed_by_peer()
        await eventually(lambda: raw.local_addr in caplog.text, deadline_s=DEADLINE)
    assert "bad or missing authentication" in caplog.text
    assert b.transport.stats.connections_rejected == 1 and b.inbox.empty()


async def test_a_handshake_recorded_on_one_connection_fails_on_the_next(caplog) -> None:
    """Both ends pick a fresh challenge per connection: the dialer's recorded AUTH does not
    answer the acceptor's next HELLO, and the acceptor's recorded HELLO + AUTH_OK do not
    answer the dialer's next challenge."""
    async with relayed(lambda conn, n, f: [f]) as (a, b, relay):
        a.transport.send(app("a", "b", 1))
        assert (await b.recv()).index == 1
        conn = relay.connections[0]
        auth, acceptor_bytes = conn.from_dialer[0], bytes(conn.from_acceptor)
        assert (auth[4], acceptor_bytes[4]) == (17, KIND_HELLO)  # AUTH; HELLO then AUTH_OK

        # 1. The AUTH again, to the acceptor.
        raw = await RawPeer.connect(b.port)
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            assert (await raw.read_frame())[0] == KIND_HELLO
            raw.send_raw(auth)
            assert await raw.closed_by_peer()
            await eventually(lambda: raw.local_addr in caplog.text, deadline_s=DEADLINE)
        assert b.transport.stats.connections_rejected == 1

        # 2. The HELLO and AUTH_OK again, to a dialer that believes this is b.
        got: list[bytes] = []

        async def replay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            hello_len = 4 + struct.unpack(">I", acceptor_bytes[:4])[0]
            writer.write(acceptor_bytes[:hello_len])
            await read_whole_frame(reader)  # the dialer's AUTH
            writer.write(acceptor_bytes[hello_len:])  # the recorded AUTH_OK
            got.append(await reader.read(65536))  # what the dialer sends next
            writer.close()

        server = await asyncio.start_server(replay, LOOPBACK, 0)
        try:
            failures = a.transport.stats.connect_failures
            a.transport.set_peers({"b": (LOOPBACK, server.sockets[0].getsockname()[1])})
            a.transport.send(app("a", "b", 2))
            await eventually(lambda: a.transport.stats.connect_failures > failures and got, deadline_s=DEADLINE)
            assert got[0] == b""  # it hung up without sending a frame
        finally:
            server.close()
            await server.wait_closed()


# ---------------------------------------------------------------------------- other modes


async def test_insecure_mode_frames_carry_no_mac() -> None:
    """Without a secret nothing changes: a plain frame after the handshake is delivered."""
    b = make_node("b")
    await b.transport.start()
    try:
        raw = await RawPeer.connect(b.port)
        await raw.handshake("a", None)
        raw.send_raw(frame(KIND_MESSAGE, encode_message(app("a", "b", 5))))
        assert (await b.recv()).index == 5
        raw.close()
    finally:
        await b.transport.stop()


async def test_a_transport_without_a_listener_opens_no_port(caplog) -> None:
    """What `dex-ha dev` uses: it can dial, but nothing can reach it (and it says so when
    it is given peers, which would have no way to answer)."""
    b = make_node("b", secret=SECRET)
    await b.transport.start()
    a = make_node("a", port=None, secret=SECRET)
    await a.transport.start()
    try:
        assert a.transport.port is None and a.transport._listener is None
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            a.transport.set_peers({"b": b.addr})
        assert "has no listener: peers b cannot send to it" in caplog.text
        a.transport.send(app("a", "b", 1))
        assert (await b.recv()).index == 1
    finally:
        await a.transport.stop()
        await b.transport.stop()


# ---------------------------------------------------------------------------- units


def test_hkdf_matches_rfc_5869_test_case_1() -> None:
    from dex_ha.raft.transport import hkdf_sha256

    okm = hkdf_sha256(
        ikm=bytes.fromhex("0b" * 22),
        salt=bytes.fromhex("000102030405060708090a0b0c"),
        info=bytes.fromhex("f0f1f2f3f4f5f6f7f8f9"),
        length=42,
    )
    assert okm.hex() == ("3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865")


class LinkKeyArgs(TypedDict):
    """The arguments of link_key."""

    secret: bytes
    dialer_challenge: bytes
    acceptor_challenge: bytes
    dialer_id: str
    acceptor_id: str
    direction: bytes


def test_link_keys_differ_by_direction_and_by_every_input() -> None:
    from dex_ha.raft.transport import ACCEPTOR_TO_DIALER, DIALER_TO_ACCEPTOR, link_key

    base = LinkKeyArgs(
        secret=SECRET,
        dialer_challenge=b"d" * 32,
        acceptor_challenge=b"a" * 32,
        dialer_id="n1",
        acceptor_id="n2",
        direction=DIALER_TO_ACCEPTOR,
    )
    variants: list[LinkKeyArgs] = [
        base,
        base | {"direction": ACCEPTOR_TO_DIALER},
        base | {"secret": SECRET + b"x"},
        base | {"dialer_challenge": b"D" * 32},
        base | {"acceptor_challenge": b"A" * 32},
        base | {"dialer_id": "n3"},
        base | {"acceptor_id": "n3"},
        base | {"dialer_id": "n1n", "acceptor_id": "2"},
    ]  # the ids are length-prefixed
    keys = [link_key(**v) for v in variants]
    assert len(set(keys)) == len(keys) and all(len(k) == 32 for k in keys)


def test_frame_mac_opens_only_the_next_frame_as_sealed() -> None:
    from dex_ha.raft.transport import FrameAuthError, FrameMac, pack_frame

    key = os.urandom(32)
    sender, receiver = FrameMac(key), FrameMac(key)
    frames = [pack_frame(KIND_MESSAGE, bytes([i]) * 40, TAG_BYTES) for i in range(3)]
    wire = [f + sender.seal(f) for f in frames]
    for f, w in zip(frames, wire):
        assert bytes(receiver.open(w[4:])) == f[4:]
    # An independent implementation of the tag: HMAC-SHA256(key, seq || frame)[:16].
    assert wire[2][-TAG_BYTES:] == hmac.new(key, struct.pack(">Q", 2) + frames[2], hashlib.sha256).digest()[:16]
    with pytest.raises(FrameAuthError):
        receiver.open(wire[2][4:])  # replayed: the receiver expects sequence number 3 now
    for i in (5, len(wire[0]) - 1):  # one bit flipped in the body, then in the tag
        flipped = bytearray(wire[0])
        flipped[i] ^= 1
        with pytest.raises(FrameAuthError):
            FrameMac(key).open(bytes(flipped[4:]))
    with pytest.raises(FrameAuthError):
        FrameMac(key).open(b"\x01" + b"x" * (TAG_BYTES - 1))  # too short to hold a tag
