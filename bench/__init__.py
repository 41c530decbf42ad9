"""Benchmarks and trace replays; run as ``python -m bench.<name>`` from the repository root."""
