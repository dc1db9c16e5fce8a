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
    NodeVersion,
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
    other messages carry no window. A response's applied index travels in the commit slot,
    which responses leave unused; other messages carry none."""
    if m.type == MessageType.HEARTBEAT:
        m.index = 0
    else:
        m.lease_window_ms = 0
    if m.type in (MessageType.APP_RESP, MessageType.HEARTBEAT_RESP):
        m.commit = 0
    else:
        m.applied = 0
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


@pytest.mark.parametrize("mtype", [MessageType.APP_RESP, MessageType.HEARTBEAT_RESP])
def test_a_responses_applied_index_travels_in_a_slot_old_peers_ignore(mtype: MessageType) -> None:
    """A follower's applied index rides in the commit slot, which responses leave unused:
    still 14 slots, an old leader reads the rest as before, and an old follower's 0 there
    reads as "applied 0"."""
    resp = Message(mtype, "n1", "n2", term=3, index=7, context=2, applied=6)
    raw = msgpack.unpackb(encode_message(resp), raw=False)
    assert len(raw) == 14 and raw[8] == 6
    assert decode_message(encode_message(resp)) == resp
    old = Message(mtype, "n1", "n2", term=3, index=7, context=2)
    assert decode_message(encode_message(old)).applied == 0


def test_slots_a_newer_peer_appends_are_ignored() -> None:
    msg = Message(MessageType.APP, "n2", "n1", term=3, index=4, log_term=2, commit=4, version=NodeVersion("9.0", 7))
    raw = msgpack.unpackb(encode_message(msg), raw=False)
    assert decode_message(msgpack.packb(raw + [123, "future"], use_bin_type=True)) == msg


@pytest.mark.parametrize("kind", [MessageType.APP, MessageType.SNAP, MessageType.HEARTBEAT_RESP])
def test_the_senders_version_travels_and_a_peer_without_one_sends_none(kind: MessageType) -> None:
    entries = [Entry(2, 5, EntryType.NORMAL, b"x")] if kind == MessageType.APP else []
    msg = Message(kind, "n2", "n1", term=3, entries=entries, version=NodeVersion("0.2.0", 2))
    assert decode_message(encode_message(msg)) == msg
    # A 0.1.0 peer's message: 14 slots, and 15 for a SNAP with its cluster id.
    unversioned = Message(
        kind, "n2", "n1", term=3, entries=entries, cluster_id="c1" if kind == MessageType.SNAP else ""
    )
    raw = msgpack.unpackb(encode_message(unversioned), raw=False)
    assert len(raw) == (15 if kind == MessageType.SNAP else 14)
    assert decode_message(encode_message(unversioned)).version is None


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


def _packed_whole(m: Message) -> bytes:
    """A message packed in one piece, as the wire format defines it."""
    meta = (
        None
        if m.snapshot is None
        else [
            m.snapshot.index,
            m.snapshot.term,
            [list(m.snapshot.conf_state.voters), list(m.snapshot.conf_state.learners)],
        ]
    )
    index = m.lease_window_ms if m.type == MessageType.HEARTBEAT else m.index
    wire_entries = [[e.term, e.index, int(e.type), e.data] for e in m.entries]
    fields = [1, int(m.type), m.to, m.frm, m.term, m.log_term, index, wire_entries]
    commit = m.applied if m.type in (MessageType.APP_RESP, MessageType.HEARTBEAT_RESP) else m.commit
    fields += [commit, m.reject, m.reject_hint, m.context, meta, m.data]
    return msgpack.packb(fields, use_bin_type=True)


@given(messages, st.lists(entries, max_size=40))
def test_a_message_put_together_from_encoded_entries_is_byte_for_byte_the_packed_message(
    msg: Message, more: list[Entry]
) -> None:
    msg.entries = msg.entries + more  # past 15 entries the array header takes 3 bytes
    assert encode_message(msg) == _packed_whole(msg)


def test_a_message_with_65536_entries_has_the_long_array_header() -> None:
    msg = Message(MessageType.APP, "n2", "n1", term=1, entries=[Entry(1, i) for i in range(1, 65537)])
    encoded = encode_message(msg)
    assert encoded == _packed_whole(msg)
    assert len(decode_message(encoded).entries) == 65536


def test_an_entry_is_encoded_once_for_the_log_and_every_follower(tmp_path, monkeypatch) -> None:
    """The leader writes an entry to its log and sends it to each follower: one msgpack
    encoding of it, whose bytes every follower's message and the log record carry."""
    from dex_ha.raft import types
    from dex_ha.raft.storage import RaftStorage

    encoded: list[int] = []
    real = types.entry_to_wire

    def counting(e: Entry) -> list[object]:
        encoded.append(e.index)
        return real(e)

    monkeypatch.setattr(types, "entry_to_wire", counting)
    batch = [Entry(1, i, EntryType.NORMAL, b"step %d" % i) for i in (1, 2, 3)]
    frames = [encode_message(Message(MessageType.APP, to, "n1", term=1, entries=batch)) for to in ("n2", "n3")]
    storage = RaftStorage.open(tmp_path / "raft", durability="relaxed")
    try:
        storage.append(HardState(term=1), batch)
    finally:
        storage.close()
    assert encoded == [1, 2, 3]
    entry_bytes = b"".join(encode_entry(e) for e in batch)
    assert all(entry_bytes in frame for frame in frames)
    assert [decode_message(f).entries for f in frames] == [batch, batch]
