"""Real-process harnesses shared by the test suite (tests/) and the benchmarks (bench/).

The code here starts, stops, measures and waits on real processes: a `dex-ha dev` server,
a local three-node cluster, HAProxy in front of it, a fault proxy on the Raft links, the
Raft key-value nodes, HTTP load, the readiness and cluster-state recorders, and the one
readiness wait (readiness.py) and polling helper (waiting.py). Neither
tests/ nor bench/ owns it, so neither imports the other.

Nothing here is pytest-specific: fixtures stay in tests/**/conftest.py. The product (dex_ha)
never imports this package, and it is not shipped in the wheel; the import contracts in
pyproject.toml check both directions (`lint-imports`).
"""
