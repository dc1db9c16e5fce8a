"""The replica check's deterministic parts on the server side: the notes and the verdict."""

from __future__ import annotations

from dex_ha.server.consistency import decode_note, divergent_members, encode_note


def test_a_note_reads_back_and_anything_else_is_not_one() -> None:
    assert decode_note(encode_note(812, "ab" * 32)) == (812, "ab" * 32)
    assert decode_note(b"\x93\xa3xyz\x01\xa1a") is None
    assert decode_note(b"not msgpack at all \xff") is None


def test_the_majority_hash_decides_and_waits_for_a_majority() -> None:
    assert divergent_members({"n1": "A"}, members=3) is None  # one of three: no majority yet
    assert divergent_members({"n1": "A", "n2": "B"}, members=3) is None
    assert divergent_members({"n1": "A", "n2": "B", "n3": "A"}, members=3) == ("A", {"n2": "B"})
    assert divergent_members({"n1": "A", "n3": "A"}, members=3) == ("A", {})
    assert divergent_members({"n1": "A", "n2": "B", "n3": "C"}, members=3) is None  # nobody is flagged
    assert divergent_members({"n1": "B", "n2": "A", "n3": "A"}, members=3) == ("A", {"n1": "B"})  # the leader too
