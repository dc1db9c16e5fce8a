"""dex_ha.engine — see DESIGN.md §2."""
