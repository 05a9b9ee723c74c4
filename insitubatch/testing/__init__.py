"""Test and benchmark helpers shipped with the package (like ``zarr.testing``): an ERA5-like data generator and a loopback object-store emulator."""
