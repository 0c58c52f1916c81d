"""The test suite (a package, so its modules import as ``tests...``; the helpers it shares with
the benchmarks are the ``harness`` package)."""
