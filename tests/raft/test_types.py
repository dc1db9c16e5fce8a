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
messages = st.builds(
    Message, st.sampled_from(list(MessageType)), ids, ids, u64, u64, u64, st.lists(entries, max_size=4),
    u64, st.booleans(), u64, u64, st.none() | metas, st.binary(max_size=64),
)


@given(messages)
def test_message_round_trip(msg: Message) -> None:
    assert decode_message(encode_message(msg)) == msg


@given(entries)
def test_entry_round_trip(e: Entry) -> None:
    assert decode_entry(encode_entry(e)) == e


def test_hard_state_and_conf_change_round_trip() -> None:
    hs = HardState(7, "n2", 41)
    assert decode_hard_state(encode_hard_state(hs)) == hs
    cc = ConfChange(ConfChangeType.ADD_LEARNER, "n4", b"\x01\x02")
    assert decode_conf_change(encode_conf_change(cc)) == cc


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_garbage_never_escapes_as_anything_but_malformed(buf: bytes) -> None:
    try:
        decode_message(buf)
    except MalformedMessage:
        pass


@pytest.mark.parametrize("raw", [
    [1, 0, "n1", "n2"],                                   # wrong arity
    [2, 0, "n1", "n2", 0, 0, 0, [], 0, False, 0, 0, None, b""],   # unknown version
    [1, 99, "n1", "n2", 0, 0, 0, [], 0, False, 0, 0, None, b""],  # unknown type
    [1, 0, 5, "n2", 0, 0, 0, [], 0, False, 0, 0, None, b""],      # id not a string
    [1, 0, "n1", "n2", -1, 0, 0, [], 0, False, 0, 0, None, b""],  # negative term
    [1, 0, "n1", "n2", 0, 0, 0, [[1]], 0, False, 0, 0, None, b""],  # broken entry
])
def test_malformed_shapes_are_rejected(raw: list) -> None:
    with pytest.raises(MalformedMessage):
        decode_message(msgpack.packb(raw, use_bin_type=True))
