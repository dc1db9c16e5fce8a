"""dex_ha.server — see docs/architecture.md."""
