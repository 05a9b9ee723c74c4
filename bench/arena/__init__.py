"""The realistic-fields arena: our loader, the pure-Python reference design and TensorStore on ERA5-shaped data.

``python -m bench.arena`` (see :mod:`bench.arena.run`). This package's
``__init__`` imports nothing: the reference's child process imports
:mod:`bench.child` (and through it this package's loaders) from its own virtual environment, where
``insitubatch`` is the reference (PyPI 0.2.0), not this repository's.
"""
