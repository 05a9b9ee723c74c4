"""Fetched bytes to resident tiles: decode jobs, assembly, the disk cache's revivals and writes, the kernels."""
