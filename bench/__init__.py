"""Benchmarks of dex-ha (README.md, "Benchmarks"); each *_bench.py runs as a script."""
