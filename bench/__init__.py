"""Benchmarks: the ingest load generator and the naive baseline it is compared with."""
