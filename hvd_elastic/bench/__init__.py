"""Benchmarks of the native scheduler. Run ``python -m hvd_elastic.bench.decisions`` (``--quick`` for a smoke run)."""
