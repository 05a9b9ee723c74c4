"""The engine's rooms: reads (a key in, its bytes out), pool (what is resident), tiles (bytes to resident tiles), passes (one pass from plan to batches)."""
