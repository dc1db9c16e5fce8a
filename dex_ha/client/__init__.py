"""dex_ha.client — see DESIGN.md §2."""
