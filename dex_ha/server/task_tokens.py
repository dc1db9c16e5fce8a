"""Task tokens: the handle a Worker gets for one attempt, and uses for its
heartbeats and its result.

A token names the attempt, by step id + attempt number + term (the fencing of §5), and
carries a secret: 128 random bits the leader draws for each hand-out. The numbers can be
guessed; the secret cannot. The leader puts the secret in the hand-out command it proposes
(`Handout` in StartAttempts, `next_token_secrets` in CompleteAttempt's eager dispatch),
because the engine must stay deterministic and draws nothing itself. The engine stores it
with the attempt, on every node, so after a failover the new active node recognises the
tokens the old one handed out (and answers 409 for attempts its takeover failed).

A node honours a token only if its secret matches the attempt's (`Engine.attempt_state`
compares in constant time); anything else, including a token that does not parse, is 404.
This needs no cluster secret, so `dex-ha dev` without one is covered too.

Format: ``{step_id}-{attempt}-{term}-{secret}``, the secret as 32 hex digits. Workers must
treat the whole token as opaque; the parts are readable only to help an operator reading
logs. Step ids are made by the engine (`st123`, `st123.4`); parsing splits from the right,
so the step id may contain anything.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

SECRET_BYTES = 16  # 128 bits: not guessable, however many attempts a Worker token makes
# Numbers of at most 18 ASCII digits: below 2**63, so SQLite can take them (a longer one
# is no attempt or term this cluster has used; it is not a token, rather than a 500).
_TOKEN = re.compile(
    rf"(?P<step_id>.+)-(?P<attempt>[0-9]{{1,18}})-(?P<term>[0-9]{{1,18}})"
    rf"-(?P<secret>[0-9a-f]{{{2 * SECRET_BYTES}}})"
)


def new_token_secret() -> str:
    """A fresh secret for one hand-out (the leader calls it; the engine never does)."""
    return secrets.token_hex(SECRET_BYTES)


@dataclass(frozen=True, slots=True)
class TaskToken:
    step_id: str
    attempt: int
    term: int
    secret: str

    def __str__(self) -> str:
        return f"{self.step_id}-{self.attempt}-{self.term}-{self.secret}"

    @classmethod
    def parse(cls, text: str) -> TaskToken | None:
        """The token `text` spells, or None when it is not one this cluster could have made."""
        m = _TOKEN.fullmatch(text)
        if m is None:
            return None
        return cls(m["step_id"], int(m["attempt"]), int(m["term"]), m["secret"])
