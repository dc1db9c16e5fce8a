"""dex_ha.raft — see docs/architecture.md."""
