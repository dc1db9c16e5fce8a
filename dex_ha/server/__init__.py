"""dex_ha.server — see DESIGN.md §2."""
