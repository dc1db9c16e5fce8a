"""A deterministic dump of a node's replicated state, read from its `state.db` with sqlite3
(read-only, the node stopped), and the comparison of the dumps of all nodes.

Which data is replicated: every row of every table of the engine's schema
(dex_ha/engine/schema.py) is written by applying committed log entries, the same on every
node (ids derive from log indexes, times from the entries), except one row: `meta` key
`applied_index`, how far this node has applied. Dumps are compared only when every node
stopped at the same applied index; that row is then equal too, and is left out of the
table digests so that a difference always names replicated data.
"""

from __future__ import annotations

import hashlib
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dex_ha.server.node import STATE_DB

# (table, key) of the rows that are each node's own: its progress, not replicated data.
NODE_LOCAL_ROWS = {("meta", "applied_index")}
DIFF_EXAMPLES = 3  # differing rows a violation shows, per table


@dataclass(frozen=True)
class StateDump:
    applied_index: int
    tables: dict[str, list[tuple[Any, ...]]]  # table -> every replicated row, sorted

    def digests(self) -> dict[str, str]:
        """Table -> sha256 of its rows (what the JSON report keeps)."""
        return {table: hashlib.sha256(repr(rows).encode()).hexdigest()[:16] for table, rows in self.tables.items()}


def dump_state(data_dir: Path) -> StateDump:
    """Every table of the node's state database, rows sorted, node-local rows left out."""
    conn = sqlite3.connect(f"file:{data_dir / STATE_DB}?mode=ro", uri=True, timeout=10)
    try:
        names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        tables = {}
        for table in names:
            rows = [tuple(r) for r in conn.execute(f'SELECT * FROM "{table}"')]
            tables[table] = sorted((r for r in rows if (table, r[0]) not in NODE_LOCAL_ROWS), key=repr)
        applied = conn.execute("SELECT value FROM meta WHERE key = 'applied_index'").fetchone()
    finally:
        conn.close()
    return StateDump(0 if applied is None else int(applied[0]), tables)


def dumps_differ(dumps: dict[str, StateDump]) -> list[str]:
    """One line per difference between the nodes' dumps (none: equal replicas). Dumps at
    different applied indexes are not compared: that is a difference of its own."""
    if len(dumps) < 2:
        return []  # nothing to compare (the report's count of tables compared shows it)
    indexes = {node: dump.applied_index for node, dump in dumps.items()}
    if len(set(indexes.values())) > 1:
        return [f"the nodes stopped at different applied indexes {indexes}: their states cannot be compared"]
    (first, reference), *others = sorted(dumps.items())
    lines = []
    for node, dump in others:
        for table in sorted(set(reference.tables) | set(dump.tables)):
            mine, theirs = reference.tables.get(table), dump.tables.get(table)
            if mine == theirs:
                continue
            if mine is None or theirs is None:
                lines.append(f"table {table} is on {first if theirs is None else node} only")
                continue
            mine_set, theirs_set = set(mine), set(theirs)
            only_first = [r for r in mine if r not in theirs_set][:DIFF_EXAMPLES]
            only_node = [r for r in theirs if r not in mine_set][:DIFF_EXAMPLES]
            lines.append(
                f"table {table}: {first} has {len(mine)} rows, {node} {len(theirs)}; "
                f"only on {first}: {only_first}; only on {node}: {only_node}"
            )
    return lines
