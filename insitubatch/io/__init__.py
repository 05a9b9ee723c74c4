"""Reading a store: opening it (``stores``), its arrays' chunk grids (``geometry``), one stored chunk to numpy (``decode``)."""
