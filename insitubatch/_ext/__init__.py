"""Compiled kernels, built from the top-level ``_ext/*.pyx`` by ``setup.py``."""
