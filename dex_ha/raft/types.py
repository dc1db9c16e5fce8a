"""Raft value types shared by the core, storage, transport and node loop.

Everything here is plain data: dataclasses plus a msgpack encoding. The pure core
(`core.py`) consumes and produces these; storage persists `Entry` and `HardState`;
the transport carries `Message` frames. Node ids are short strings (``"n1"``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import msgpack

NO_NODE = ""  # "no vote" / "no leader"


class EntryType(enum.IntEnum):
    NORMAL = 0  # application command; empty data is the leader's no-op of a new term
    CONF_CHANGE = 1  # data is an encoded ConfChange


class ConfChangeType(enum.IntEnum):
    ADD_LEARNER = 0  # add a non-voting member that receives the log
    PROMOTE = 1  # turn a learner into a voter
    REMOVE = 2  # remove a voter or learner


class MessageType(enum.IntEnum):
    APP = 0  # AppendEntries (also carries commit)
    APP_RESP = 1
    HEARTBEAT = 2
    HEARTBEAT_RESP = 3
    PRE_VOTE = 4
    PRE_VOTE_RESP = 5
    VOTE = 6
    VOTE_RESP = 7
    SNAP = 8  # install snapshot: `snapshot` is the meta, `data` the whole payload
    TIMEOUT_NOW = 9  # leadership transfer: the target campaigns at once
    TRANSFER_LEADER = 10  # a non-leader forwards a transfer request; `index` unused, target in `frm`
    NOTE = 11  # the application's own message to a member, in `data`; the core never sees it


class Role(enum.IntEnum):
    FOLLOWER = 0
    PRE_CANDIDATE = 1
    CANDIDATE = 2
    LEADER = 3
    LEARNER = 4  # a follower that is not a voter in the current configuration


@dataclass(frozen=True, slots=True)
class Entry:
    term: int
    index: int
    type: EntryType = EntryType.NORMAL
    data: bytes = b""
    # The entry's msgpack (encode_entry), made on first use and kept: the leader writes
    # an entry to its log and sends it to every follower, and all of them use these same
    # bytes rather than encoding it again. Not part of the entry's value (no compare).
    _encoded: bytes | None = field(default=None, init=False, repr=False, compare=False)

    def size(self) -> int:
        """Approximate encoded size, used for flow control and batching."""
        return len(self.data) + 16


@dataclass(frozen=True, slots=True)
class HardState:
    term: int = 0
    vote: str = NO_NODE
    commit: int = 0
    # How long this node must refuse votes after a restart: the vote-refusal window it
    # last promised a leader (a leader's lease counts on it; see core.py, "the leader
    # lease"). 0 in logs written before it existed: the node's own election timeout.
    vote_refusal_ms: int = 0


@dataclass(frozen=True, slots=True)
class ConfState:
    voters: tuple[str, ...] = ()
    learners: tuple[str, ...] = ()

    def members(self) -> tuple[str, ...]:
        return self.voters + self.learners


@dataclass(frozen=True, slots=True)
class ConfChange:
    type: ConfChangeType
    node_id: str
    # Opaque to the core: the node loop stores addresses here (raft address, URL).
    context: bytes = b""


@dataclass(frozen=True, slots=True)
class SnapshotMeta:
    index: int
    term: int
    conf_state: ConfState


@dataclass(slots=True)
class Message:
    type: MessageType
    to: str
    frm: str
    term: int = 0
    log_term: int = 0  # APP: term of the entry at `index`; votes: last log term
    index: int = 0  # APP: index before `entries`; votes: last log index; resp: match/hint
    entries: list[Entry] = field(default_factory=list)
    commit: int = 0
    reject: bool = False
    reject_hint: int = 0  # APP_RESP reject: follower's last index, for fast backtracking
    # Free-form integer carried back in responses: heartbeats use it as a round id so the
    # leader can tell which heartbeat a quorum acknowledged (lease), votes use 1 to mean
    # "leadership transfer: ignore the recent-leader check".
    context: int = 0
    snapshot: SnapshotMeta | None = None
    data: bytes = b""  # SNAP: the snapshot payload
    # HEARTBEAT: how long the receiver must refuse votes after receiving it, because the
    # sender's lease counts on that (the leader's election_timeout_min). 0 elsewhere, and
    # from leaders older than this field: the receiver then uses its own timeout.
    lease_window_ms: int = 0
    # APP_RESP and HEARTBEAT_RESP: the index the sender has applied to its state machine,
    # so that the leader can show real progress (a follower may store entries it has not
    # applied). 0 elsewhere, and from peers older than this field.
    applied: int = 0
    # SNAP: the sender's cluster id (identity.py), so that a node installing a snapshot
    # learns it or refuses a snapshot of another cluster. A 15th slot, SNAP only.
    cluster_id: str = ""
    # Every message: the sender's release and state-machine version (the transport sets
    # it on sending). None from a peer of a release before this field (0.1.0).
    version: NodeVersion | None = None


@dataclass(frozen=True, slots=True)
class NodeVersion:
    """What a node runs: its release (the package version) and the newest state-machine
    version it can apply (the application's number; Raft only carries it)."""

    package: str
    state_machine: int

    def to_wire(self) -> list[Any]:
        return [self.package, self.state_machine]

    @classmethod
    def from_wire(cls, raw: object) -> NodeVersion:
        if not (
            isinstance(raw, list)
            and len(raw) >= 2
            and isinstance(raw[0], str)
            and len(raw[0]) <= 64
            and isinstance(raw[1], int)
            and raw[1] >= 0
        ):
            raise MalformedMessage("version must be [package, state machine]")
        return cls(raw[0], raw[1])


@dataclass(slots=True)
class Ready:
    """What the node loop must do now, in this order (the etcd ordering):

    1. persist `snapshot` (if any), then `entries` and `hard_state` — durably when
       `must_sync` and durability is strict;
    2. send `messages` (they may depend on what step 1 persisted);
    3. apply `snapshot` data to the state machine, then `committed_entries` in order;
    4. call `core.advance(ready)`.
    """

    hard_state: HardState | None = None
    entries: list[Entry] = field(default_factory=list)
    snapshot: SnapshotMeta | None = None
    snapshot_data: bytes = b""
    committed_entries: list[Entry] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    must_sync: bool = False

    def is_empty(self) -> bool:
        return (
            self.hard_state is None
            and not self.entries
            and self.snapshot is None
            and not self.committed_entries
            and not self.messages
        )


# ---------------------------------------------------------------------------------
# msgpack encoding. Compact positional arrays; version byte first on messages so the
# wire format can evolve.

WIRE_VERSION = 1


def _conf_to_wire(cs: ConfState) -> list[Any]:
    return [list(cs.voters), list(cs.learners)]


def _conf_from_wire(raw: list[Any]) -> ConfState:
    return ConfState(tuple(raw[0]), tuple(raw[1]))


def snapshot_meta_to_wire(meta: SnapshotMeta) -> list[Any]:
    return [meta.index, meta.term, _conf_to_wire(meta.conf_state)]


def snapshot_meta_from_wire(raw: list[Any]) -> SnapshotMeta:
    return SnapshotMeta(raw[0], raw[1], _conf_from_wire(raw[2]))


def entry_to_wire(e: Entry) -> list[Any]:
    return [e.term, e.index, int(e.type), e.data]


def entry_from_wire(raw: list[Any]) -> Entry:
    return Entry(raw[0], raw[1], EntryType(raw[2]), raw[3])


def pack(obj: object) -> bytes:
    """msgpack.packb with bin types, typed: msgpack ships no type information."""
    data: bytes = msgpack.packb(obj, use_bin_type=True)
    return data


def encode_entry(e: Entry) -> bytes:
    """The entry's msgpack; encoded once per Entry object (see Entry._encoded)."""
    encoded = e._encoded
    if encoded is None:
        encoded = pack(entry_to_wire(e))
        object.__setattr__(e, "_encoded", encoded)  # a cache of immutable fields: frozen in meaning
    return encoded


def decode_entry(buf: bytes) -> Entry:
    return entry_from_wire(msgpack.unpackb(buf, raw=False))


def hard_state_to_wire(hs: HardState) -> list[Any]:
    return [hs.term, hs.vote, hs.commit, hs.vote_refusal_ms]


def hard_state_from_wire(raw: list[Any]) -> HardState:
    """Also reads the 3-field form written before `vote_refusal_ms` existed."""
    if len(raw) == 3:
        return HardState(raw[0], raw[1], raw[2])
    t, v, c, refusal = raw
    return HardState(t, v, c, refusal)


def encode_hard_state(hs: HardState) -> bytes:
    return pack(hard_state_to_wire(hs))


def decode_hard_state(buf: bytes) -> HardState:
    return hard_state_from_wire(msgpack.unpackb(buf, raw=False))


def encode_conf_change(cc: ConfChange) -> bytes:
    return pack([int(cc.type), cc.node_id, cc.context])


def decode_conf_change(buf: bytes) -> ConfChange:
    t, n, ctx = msgpack.unpackb(buf, raw=False)
    return ConfChange(ConfChangeType(t), n, ctx)


def encode_snapshot_meta(meta: SnapshotMeta) -> bytes:
    return pack(snapshot_meta_to_wire(meta))


def decode_snapshot_meta(buf: bytes) -> SnapshotMeta:
    return snapshot_meta_from_wire(msgpack.unpackb(buf, raw=False))


# Wire slots are positional and version 1 peers want exactly 14 of them, so a new field
# travels in a slot its message type leaves unused: a HEARTBEAT's `lease_window_ms` in the
# `index` slot. Old peers ignore a heartbeat's index; an old leader sends 0 there, which
# reads as "no window" (the receiver's own timeout, the old rule). A response's `applied`
# travels in the `commit` slot, which responses leave unused: an old leader ignores it, an
# old follower sends 0 there.

_RESPONSES_WITH_APPLIED = (MessageType.APP_RESP, MessageType.HEARTBEAT_RESP)


def _index_slot(m: Message) -> int:
    return m.lease_window_ms if m.type == MessageType.HEARTBEAT else m.index


def _commit_slot(m: Message) -> int:
    return m.applied if m.type in _RESPONSES_WITH_APPLIED else m.commit


def _array_header(n: int) -> bytes:
    """The msgpack header of an array of n items."""
    if n < 16:
        return bytes((0x90 | n,))
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def _head_slots(m: Message) -> list[Any]:
    """A message's 7 slots before its entries."""
    return [WIRE_VERSION, int(m.type), m.to, m.frm, m.term, m.log_term, _index_slot(m)]


def _tail_slots(m: Message) -> list[Any]:
    """A message's 6 slots after its entries."""
    snapshot = snapshot_meta_to_wire(m.snapshot) if m.snapshot is not None else None
    return [_commit_slot(m), m.reject, m.reject_hint, m.context, snapshot, m.data]


def _extra_slots(m: Message) -> list[Any]:
    """The slots after the 14 every peer reads: a SNAP's cluster id (slot 14, "" when
    none), then the sender's version (slot 14 of other messages, 15 of a SNAP). Peers of
    0.1.0 ignore what is beyond the 14, and read slot 14 of a SNAP only."""
    version = [m.version.to_wire()] if m.version is not None else []
    if m.type == MessageType.SNAP and (m.cluster_id or version):
        return [m.cluster_id, *version]
    return version


def encode_message(m: Message) -> bytes:
    """A message's msgpack. With entries, the message is put together around each entry's
    encode_entry() bytes (the same bytes as packing the whole message at once), so an
    entry sent to several followers, and written to the leader's log, is encoded once."""
    extra = _extra_slots(m)
    if not m.entries:
        return pack([*_head_slots(m), [], *_tail_slots(m), *extra])
    # Two packed arrays (7 and 6 slots, one-byte headers) with their headers cut off,
    # the entries in between: msgpack arrays are their header followed by their items.
    head = pack(_head_slots(m))[1:]
    tail = pack([*_tail_slots(m), *extra])[1:]
    entries = b"".join([encode_entry(e) for e in m.entries])
    return b"".join((_array_header(14 + len(extra)), head, _array_header(len(m.entries)), entries, tail))


class MalformedMessage(ValueError):
    """A frame that does not decode to a valid Message (a bad or hostile peer)."""


def decode_message(buf: bytes | memoryview) -> Message:
    try:
        raw = msgpack.unpackb(buf, raw=False)
        # More than 14 slots: fields a newer peer appended; ignored, so that one can be
        # added later without breaking a rolling upgrade.
        if not isinstance(raw, list) or len(raw) < 14 or raw[0] != WIRE_VERSION:
            raise MalformedMessage("unexpected message shape or version")
        (_, typ, to, frm, term, log_term, index, entries, commit, reject, hint, ctx, snap, data) = raw[:14]
        if not (isinstance(to, str) and isinstance(frm, str)):
            raise MalformedMessage("node ids must be strings")
        for v in (term, log_term, index, commit, hint, ctx):
            if not isinstance(v, int) or v < 0:
                raise MalformedMessage("integer field out of range")
        if not isinstance(data, bytes):
            raise MalformedMessage("data must be bytes")
        mtype = MessageType(typ)
        heartbeat = mtype == MessageType.HEARTBEAT
        extra = raw[14:]
        cluster_id = extra.pop(0) if mtype == MessageType.SNAP and extra else ""
        if not isinstance(cluster_id, str) or len(cluster_id) > 64:
            raise MalformedMessage("cluster_id must be a short string")
        version = NodeVersion.from_wire(extra[0]) if extra else None
        response = mtype in _RESPONSES_WITH_APPLIED
        return Message(
            type=mtype,
            to=to,
            frm=frm,
            term=term,
            log_term=log_term,
            index=0 if heartbeat else index,
            lease_window_ms=index if heartbeat else 0,
            entries=[entry_from_wire(e) for e in entries],
            commit=0 if response else commit,
            applied=commit if response else 0,
            reject=bool(reject),
            reject_hint=hint,
            context=ctx,
            snapshot=snapshot_meta_from_wire(snap) if snap is not None else None,
            data=data,
            cluster_id=cluster_id,
            version=version,
        )
    except MalformedMessage:
        raise
    except Exception as exc:  # msgpack errors, bad enums, wrong arity inside
        raise MalformedMessage(f"cannot decode message: {exc}") from exc
