"""Fetched bytes to resident tiles: the tile sources, decode jobs, assembly, the disk cache's revivals, the kernels."""
