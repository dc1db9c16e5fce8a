"""Measure RaftStorage append throughput: python -m bench.storage_bench [dir].

Prints appends/s (entries) and fsyncs/s for batches of 1 and 100 entries of 256 bytes,
in strict and relaxed durability. Not a test; numbers for the report and bench/.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from dex_ha.raft.storage import RaftStorage
from dex_ha.raft.types import Entry, HardState


def run(dir: Path, durability: str, batch: int, seconds: float = 2.0) -> dict[str, float]:
    st = RaftStorage.open(dir, durability=durability)
    payload = b"p" * 256
    index, saves = st.last_index(), 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        entries = [Entry(1, index + i + 1, data=payload) for i in range(batch)]
        index += batch
        st.save(HardState(1, "n1", index - batch), entries)
        saves += 1
    elapsed = time.perf_counter() - t0
    fsyncs = st.fsync_count
    st.close()
    return {"appends_per_s": saves * batch / elapsed, "saves_per_s": saves / elapsed, "fsyncs_per_s": fsyncs / elapsed}


def main() -> None:
    base = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="dex-storage-bench-"))
    print(f"{'durability':10} {'batch':>5} {'appends/s':>12} {'saves/s':>10} {'fsyncs/s':>10}")
    for durability in ("strict", "relaxed"):
        for batch in (1, 100):
            r = run(base / f"{durability}-{batch}", durability, batch)
            print(
                f"{durability:10} {batch:5d} {r['appends_per_s']:12.0f} "
                f"{r['saves_per_s']:10.0f} {r['fsyncs_per_s']:10.0f}"
            )


if __name__ == "__main__":
    main()
