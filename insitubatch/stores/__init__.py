"""The store layer: the store factories, the settings each store carries, and what closes with it."""
