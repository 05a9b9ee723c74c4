"""The end-to-end benchmark: a loopback cloud-store emulator, an ERA5-like data
generator, peer baselines and the report (``python -m bench.run``).

Bench-only code: nothing in ``insitubatch`` imports it. Tests import the
emulator as ``insitubatch.testing.emulator``.
"""
