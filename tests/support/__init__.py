"""Helpers for the tests and the benchmarks (not part of the installed packages)."""
