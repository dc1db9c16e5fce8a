"""dex_ha.raft — see DESIGN.md §2."""
