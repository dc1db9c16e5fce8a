"""Membership changes as pure functions over `ConfState`: validating and applying one
change, replaying the changes in a log, and the bootstrap changes of a brand-new cluster.

The core (core.py) decides WHEN a change may be proposed (one at a time, after its own
no-op) and tracks where the CONF_CHANGE entries sit in its log; what a change DOES to a
configuration is here, apart from the consensus state machine, because every node must
compute it alike from the same entries (the "Safety: membership changes" section of the
core's docstring rests on that) and because it is easiest to check on its own. Changes are
single-server (add a learner, promote a learner, remove a member), like the Raft
dissertation's §4.1; there are no joint configurations.
"""

from __future__ import annotations

from collections.abc import Iterable

from .errors import ConfChangeRefused
from .types import ConfChange, ConfChangeType, ConfState, Entry, decode_conf_change

__all__ = ["apply_conf_change", "bootstrap_changes", "canonical_conf", "check_fits", "conf_after", "decode_change"]


def canonical_conf(cs: ConfState) -> ConfState:
    """Sorted, de-duplicated form, so equal configurations compare equal."""
    voters = tuple(sorted(set(cs.voters)))
    learners = tuple(sorted(set(cs.learners) - set(voters)))
    return ConfState(voters, learners)


def apply_conf_change(cs: ConfState, cc: ConfChange) -> ConfState | None:
    """The configuration after `cc`, or None if `cc` is not valid in `cs`.

    Every node replays the same entries from the same base, so an invalid change is a
    no-op everywhere alike.
    """
    voters, learners = set(cs.voters), set(cs.learners)
    node = cc.node_id
    if not isinstance(node, str) or not node:
        return None
    if cc.type == ConfChangeType.ADD_LEARNER:
        if node in voters or node in learners:
            return None
        learners.add(node)
    elif cc.type == ConfChangeType.PROMOTE:
        if node not in learners:
            return None
        learners.discard(node)
        voters.add(node)
    elif cc.type == ConfChangeType.REMOVE:
        if node in learners:
            learners.discard(node)
        elif node in voters and len(voters) > 1:
            voters.discard(node)
        else:
            return None
    else:
        return None
    return canonical_conf(ConfState(tuple(voters), tuple(learners)))


def check_fits(cs: ConfState, cc: ConfChange) -> None:
    """Raise ConfChangeRefused unless `cc` is valid in `cs` (adding a member twice,
    promoting a voter, removing the last voter, ... are not)."""
    if apply_conf_change(cs, cc) is None:
        raise ConfChangeRefused(
            f"{cc.type.name.lower()} {cc.node_id!r} does not fit the configuration "
            f"(voters {sorted(cs.voters)}, learners {sorted(cs.learners)})"
        )


def decode_change(data: bytes) -> ConfChange | None:
    """The change a CONF_CHANGE entry holds; None if it cannot be decoded."""
    try:
        cc = decode_conf_change(data)
    except Exception:  # an undecodable change is a no-op on every node alike
        return None
    return cc


def conf_after(base: ConfState, entries: Iterable[Entry | None]) -> ConfState:
    """The configuration after the CONF_CHANGE `entries` (in log order) from `base`.
    Missing, undecodable and invalid changes are skipped, on every node alike."""
    conf = base
    for e in entries:
        cc = decode_change(e.data) if e is not None else None
        if cc is not None:
            conf = apply_conf_change(conf, cc) or conf
    return conf


def bootstrap_changes(initial: ConfState) -> list[ConfChange]:
    """The changes that rebuild `initial` from an empty configuration: ADD_LEARNER and
    PROMOTE per voter, then ADD_LEARNER per learner. The first leader of a brand-new
    cluster writes them into the log so that a node added later can rebuild the
    configuration from the log alone."""
    changes = []
    for v in initial.voters:
        changes.append(ConfChange(ConfChangeType.ADD_LEARNER, v))
        changes.append(ConfChange(ConfChangeType.PROMOTE, v))
    changes += [ConfChange(ConfChangeType.ADD_LEARNER, n) for n in initial.learners]
    return changes
