"""Tools around the loader: checks and probes a user runs by hand, not the engine's path."""
