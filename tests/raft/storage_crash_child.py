"""Child process for the storage crash tests: run a workload, acknowledge each operation.

    python -m tests.raft.storage_crash_child DIR SEED N_OPS SEGMENT_BYTES

Prints ``ack <i>`` (flushed) after operation i returned, i.e. once it is durable, and
``done`` at the end. The parent SIGKILLs it at some moment, or arms a failpoint through
DEX_HA_FAILPOINTS so it os._exit()s at a named point inside the storage.
"""

from __future__ import annotations

import sys

from dex_ha.raft.storage import RaftStorage
from tests.raft.storage_workload import generate, run_op


def main() -> None:
    dir, seed, n_ops, segment_bytes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    ops = generate(seed, n_ops)
    st = RaftStorage.open(dir, durability="strict", segment_bytes=segment_bytes)
    out = sys.stdout
    for i, op in enumerate(ops):
        run_op(st, op)
        out.write(f"ack {i}\n")
        out.flush()
    st.close()
    out.write("done\n")
    out.flush()


if __name__ == "__main__":
    main()
