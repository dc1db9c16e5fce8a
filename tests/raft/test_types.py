"""Wire encoding of Raft values: round trips, and hostile bytes never crash the decoder."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dex_ha.raft.types import (
    ConfChange,
    ConfChangeType,
    ConfState,
    Entry,
    EntryType,
    HardState,
    MalformedMessage,
    Message,
    MessageType,
    SnapshotMeta,
    decode_conf_change,
    decode_entry,
    decode_hard_state,
    decode_message,
    encode_conf_change,
    encode_entry,
    encode_hard_state,
    encode_message,
)

ids = st.sampled_from(["n1", "n2", "n3", ""])
u64 = st.integers(min_value=0, max_value=2**63 - 1)
entries = st.builds(Entry, u64, u64, st.sampled_from(list(EntryType)), st.binary(max_size=64))
metas = st.builds(SnapshotMeta, u64, u64, st.builds(ConfState, st.tuples(ids, ids), st.tuples(ids)))


def _wire_shape(m: Message) -> Message:
    """A heartbeat's lease window travels in the index slot, which heartbeats leave unused;
    other messages carry no window."""
    if m.type == MessageType.HEARTBEAT:
        m.index = 0
    else:
        m.lease_window_ms = 0
    return m


messages = st.builds(
    Message,
    st.sampled_from(list(MessageType)),
    ids,
    ids,
    u64,
    u64,
    u64,
    st.lists(entries, max_size=4),
    u64,
    st.booleans(),
    u64,
    u64,
    st.none() | metas,
    st.binary(max_size=64),
    u64,
).map(_wire_shape)


@given(messages)
def test_message_round_trip(msg: Message) -> None:
    assert decode_message(encode_message(msg)) == msg


@given(entries)
def test_entry_round_trip(e: Entry) -> None:
    assert decode_entry(encode_entry(e)) == e


def test_heartbeat_window_travels_in_a_slot_old_peers_decode() -> None:
    """Version-1 peers want exactly 14 slots and ignore a heartbeat's index: they still
    read a new leader's heartbeats, and an old leader's (index 0) read as "no window"."""
    hb = Message(MessageType.HEARTBEAT, "n2", "n1", term=3, commit=5, context=9, lease_window_ms=1000)
    raw = msgpack.unpackb(encode_message(hb), raw=False)
    assert len(raw) == 14 and raw[6] == 1000
    assert decode_message(encode_message(hb)) == hb
    old = Message(MessageType.HEARTBEAT, "n2", "n1", term=3, commit=5, context=9)
    assert decode_message(encode_message(old)).lease_window_ms == 0


def test_slots_a_newer_peer_appends_are_ignored() -> None:
    msg = Message(MessageType.APP, "n2", "n1", term=3, index=4, log_term=2, commit=4)
    raw = msgpack.unpackb(encode_message(msg), raw=False)
    assert decode_message(msgpack.packb(raw + [123, "future"], use_bin_type=True)) == msg


def test_hard_state_and_conf_change_round_trip() -> None:
    hs = HardState(7, "n2", 41, 1500)
    assert decode_hard_state(encode_hard_state(hs)) == hs
    # Written before vote_refusal_ms existed: 0, i.e. the node's own election timeout.
    assert decode_hard_state(msgpack.packb([7, "n2", 41])) == HardState(7, "n2", 41, 0)
    cc = ConfChange(ConfChangeType.ADD_LEARNER, "n4", b"\x01\x02")
    assert decode_conf_change(encode_conf_change(cc)) == cc


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_garbage_never_escapes_as_anything_but_malformed(buf: bytes) -> None:
    try:
        decode_message(buf)
    except MalformedMessage:
        pass


@pytest.mark.parametrize(
    "raw",
    [
        [1, 0, "n1", "n2"],  # wrong arity
        [2, 0, "n1", "n2", 0, 0, 0, [], 0, False, 0, 0, None, b""],  # unknown version
        [1, 99, "n1", "n2", 0, 0, 0, [], 0, False, 0, 0, None, b""],  # unknown type
        [1, 0, 5, "n2", 0, 0, 0, [], 0, False, 0, 0, None, b""],  # id not a string
        [1, 0, "n1", "n2", -1, 0, 0, [], 0, False, 0, 0, None, b""],  # negative term
        [1, 0, "n1", "n2", 0, 0, 0, [[1]], 0, False, 0, 0, None, b""],  # broken entry
    ],
)
def test_malformed_shapes_are_rejected(raw: list) -> None:
    with pytest.raises(MalformedMessage):
        decode_message(msgpack.packb(raw, use_bin_type=True))
