"""Benchmark scripts and their plotting helpers (see benchmarks/README.md)."""
