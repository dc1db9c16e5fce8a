"""dex_ha.worker — see DESIGN.md §2."""
