"""The package's public surface: sorted ``__all__``, every name importable."""

from __future__ import annotations

import insitubatch


def test_all_is_sorted_and_importable() -> None:
    assert insitubatch.__all__ == sorted(insitubatch.__all__)
    for name in insitubatch.__all__:
        assert hasattr(insitubatch, name), name


def test_version_comes_from_package_metadata() -> None:
    from importlib import metadata

    try:
        expected = metadata.version("insitubatch")
    except metadata.PackageNotFoundError:  # running from a tree nobody installed
        expected = "0+unknown"
    assert insitubatch.__version__ == expected
