"""The end-to-end benchmark: peer baselines and the report (``python -m bench.run``).

The loopback cloud-store emulator and the ERA5-like data generator it serves
live in ``insitubatch.testing`` (tests and examples use them too).
"""
